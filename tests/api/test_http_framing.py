"""Requests the HTTP parser refuses before any application code runs, on raw sockets: each is
answered with a JSON error (400, 414, 431 or 501) and ``Connection: close``, and the connection
closes, where Twisted answered an empty ``400 Bad Request`` or closed without a word."""

from __future__ import annotations

import json
import re
import socket
from urllib.parse import urlparse

import httpx
import pytest

from .conftest import API_KEY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BODY = b'{"messages": [{"role": "user", "content": "Hi"}]}'


def exchange(url: str, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``raw`` on a fresh connection and read until the server closes it: the status,
    headers (lower-cased names) and body of the one answer."""
    address = urlparse(url)
    sock = socket.create_connection((address.hostname, address.port), timeout=30)
    received = b""
    try:
        sock.sendall(raw)
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass  # what a close with unread input does: checked below as "no answer"
    finally:
        sock.close()
    head, sep, body = received.partition(b"\r\n\r\n")
    assert sep, f"the connection closed without an answer: {received!r}"
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def request(head: list[str], body: bytes = b"", path: str = "/v1/chat/completions") -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: 127.0.0.1",
        "Content-Type: application/json",
        f"Authorization: Bearer {API_KEY}",  # so that the body is read, not refused from the head
        *head,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def check_refusal(url: str, raw: bytes, status: int, code: str, says: str) -> dict:
    got, headers, body = exchange(url, raw)
    assert got == status, body
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    error = json.loads(body)["error"]
    assert error["code"] == code
    assert error["type"] == ("not_implemented_error" if status == 501 else "invalid_request_error")
    assert re.search(says, error["message"]), error["message"]
    return error


MANY_HEADERS = [f"X-Filler-{i}: {i}" for i in range(2000)]


@pytest.mark.parametrize(
    ("raw", "status", "code", "says"),
    [
        (request(["Content-Length: twelve"], BODY), 400, "malformed_request", r"Content-Length 'twelve'"),
        (request(["Content-Length: -5"], BODY), 400, "malformed_request", r"Content-Length '-5'"),
        (
            request([f"Content-Length: {len(BODY)}", "Transfer-Encoding: chunked"], BODY),
            400,
            "malformed_request",
            r"more than one Content-Length or Transfer-Encoding",
        ),
        (
            request([f"Content-Length: {len(BODY)}", f"Content-Length: {len(BODY) + 1}"], BODY),
            400,
            "malformed_request",
            r"more than one Content-Length",
        ),
        (
            request(["Transfer-Encoding: chunked"], b"zz\r\n" + BODY + b"\r\n0\r\n\r\n"),
            400,
            "malformed_request",
            r"chunked body is malformed: Chunk-size must be an integer",
        ),
        (request(["Transfer-Encoding: gzip"], BODY), 501, "unsupported_transfer_encoding", r"'gzip'"),
        (request(MANY_HEADERS, BODY), 431, "request_header_fields_too_large", r"more than 500 header fields"),
        (request(["X-Big: " + "a" * 100_000], BODY), 431, "request_header_fields_too_large", r"16384-byte"),
        (
            request([f"X-Part-{i}: " + "a" * 1000 for i in range(20)], BODY),
            431,
            "request_header_fields_too_large",
            r"exceeds the 16384-byte limit",
        ),
        (
            request(["Bad Header: 1"], BODY),
            400,
            "malformed_request",
            r"'Bad Header' is not a token",
        ),
        (request(["NoColonHere"], BODY), 400, "malformed_request", r"header line 'NoColonHere' has no colon"),
        (b"HELLO\r\n\r\n", 400, "malformed_request", r"request line 'HELLO' is not 'METHOD target HTTP/1.1'"),
        (b"GET / HTTP/3.0\r\n\r\n", 400, "malformed_request", r"HTTP version 'HTTP/3.0'"),
        (b"\x16\x03\x01\x02\x00\x01\x00\r\n\r\n", 400, "malformed_request", r"request line"),
        (request([], path="/v1/models?q=" + "a" * 9000), 414, "uri_too_long", r"8192-byte limit"),
        (request([], path="/" + "a" * 100_000), 414, "uri_too_long", r"8192-byte limit"),
    ],
    ids=[
        "content-length-not-a-number",
        "content-length-negative",
        "content-length-and-chunked",
        "two-content-lengths",
        "bad-chunk-size",
        "unknown-transfer-encoding",
        "2000-headers",
        "100KB-header",
        "20KB-of-headers",
        "header-name-with-space",
        "header-without-colon",
        "garbage-request-line",
        "http-3-request-line",
        "tls-on-the-plain-port",
        "9KB-uri",
        "100KB-uri",
    ],
)
def test_unparseable_requests_get_a_json_error_and_a_close(idle_server, raw, status, code, says):
    check_refusal(idle_server.url, raw, status, code, says)


def test_the_messages_endpoint_answers_in_the_anthropic_envelope(idle_server):
    _, _, body = exchange(idle_server.url, request(["Content-Length: x"], BODY, path="/v1/messages"))
    payload = json.loads(body)
    assert payload["type"] == "error" and payload["error"]["type"] == "invalid_request_error"
    assert "Content-Length 'x'" in payload["error"]["message"]


def test_a_malformed_request_after_a_good_one_on_the_same_connection(idle_server):
    """Keep-alive: the first request is answered normally, the garbage after it gets its 400."""
    good = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    status, _, body = exchange(idle_server.url, good + b"NONSENSE\r\n\r\n")
    assert status == 200  # the first answer; the second follows it on the same connection
    assert b'"code": "malformed_request"' in body and b"HTTP/1.1 400 Bad Request" in body


def test_refusals_are_counted_and_the_server_keeps_serving(idle_server):
    exchange(idle_server.url, b"HELLO\r\n\r\n")
    metrics = httpx.get(idle_server.url + "/metrics", headers={"authorization": f"Bearer {API_KEY}"}).text
    assert re.search(r'lmserve_http_requests_total\{endpoint="other",status="400"\} [1-9]', metrics)
    assert idle_server.health()["status"] == "ok"
