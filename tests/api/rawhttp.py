"""Raw-socket HTTP helpers: requests whose reading (or not reading) the test controls."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse


class RawRequest:
    """One HTTP/1.1 request on its own socket; the response is read only when asked."""

    def __init__(
        self,
        base_url: str,
        path: str,
        body: dict | bytes,
        headers: dict | None = None,
        rcvbuf: int | None = None,
    ):
        url = urlparse(base_url)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            # A small receive window makes a non-reading client push back on the server early.
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(120)
        self.sock.connect((url.hostname, url.port))
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        head = [
            f"POST {path} HTTP/1.1",
            f"Host: {url.hostname}",
            f"Content-Length: {len(payload)}",
            "Content-Type: application/json",
            "Connection: close",
        ]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        self.received = b""

    def read_until(self, predicate, timeout: float = 120.0) -> bytes:
        """Read until ``predicate(received)`` holds (or the server closes)."""
        deadline = time.monotonic() + timeout
        while not predicate(self.received):
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            self.received += chunk
        return self.received

    def read_all(self, timeout: float = 120.0) -> bytes:
        return self.read_until(lambda _: False, timeout)

    def frames(self) -> list[str]:
        """The SSE data payloads received so far."""
        body = self.received.split(b"\r\n\r\n", 1)[-1].decode("utf-8", "replace")
        return [line[len("data: ") :] for line in body.splitlines() if line.startswith("data: ")]

    def status(self) -> int:
        return int(self.received.split(b" ", 2)[1])

    def close(self) -> None:
        self.sock.close()


def count_frames(data: bytes) -> int:
    """SSE frames in a raw response so far (each starts its own line with ``data: ``)."""
    return data.count(b"\ndata: ")
