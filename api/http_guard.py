"""Refusals decided from a request's head, before its body is read (the HTTP layer).

daphne (Twisted) collects a whole request body before the ASGI application sees the request,
then queues all of it at once: a 1 GiB upload cost 1 GiB of RSS before the consumer could
answer 413, and a request without the API key got its 401 only after the upload. Here the
Twisted request checks the head as soon as it is complete: a ``Content-Length`` over the limit
is a 413 and a missing or wrong key on a guarded API path a 401, answered at once; a chunked
body is counted as its chunks arrive and refused the moment it passes the limit. After a
refusal the rest of the body is read and dropped (closing with unread input would reset the
connection and could destroy the answer before the client reads it) for at most
``REFUSAL_LINGER`` seconds, then the connection closes.

The consumers keep their own checks (``ApiConsumer.check_request``) for the ASGI application
served by anything else (``manage.py runserver``).
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus

from daphne.http_protocol import HTTPFactory, WebRequest
from twisted.internet import reactor

from api.auth import check_api_key
from api.errors import ApiError, wants_anthropic_errors
from api.metrics import count_response
from inference.runtime.service import ServeConfig

logger = logging.getLogger("lmserve.server")

REFUSAL_LINGER = 5.0  # seconds a refused upload may keep sending before the connection closes


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body exceeds the {limit}-byte limit", None, "request_too_large")


def head_refusal(
    config: ServeConfig, path: str, headers: list[tuple[bytes, bytes]], length: int | None
) -> ApiError | None:
    """The error a request is refused with from its head alone: the declared body is over the
    limit, or the path needs the API key and the request lacks it. None lets it through."""
    from api.routing import consumer_for  # routing imports the consumers, which need Django

    if length is not None and length > config.max_body_bytes:
        return too_large(config.max_body_bytes)
    consumer = consumer_for(path)
    if consumer is not None and consumer.needs_auth:
        return check_api_key(config.api_key, headers)
    return None


def refusal_bytes(error: ApiError, path: str, headers: list[tuple[bytes, bytes]]) -> bytes:
    """A complete HTTP/1.1 response carrying ``error`` in the client's dialect, closing."""
    payload = error.anthropic_payload() if wants_anthropic_errors(path, headers) else error.openai_payload()
    body = json.dumps(payload, ensure_ascii=False).encode()
    lines = [
        f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}".encode(),
        b"Content-Type: application/json",
        b"Content-Length: " + str(len(body)).encode(),
        b"Connection: close",
        *(name + b": " + value for name, value in error.headers()),
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


class GuardedRequest(WebRequest):
    """daphne's request, refusing from the head and bounding the body as it arrives."""

    refusal: ApiError | None = None
    received = 0

    def __init__(self, *args, **kwargs):
        # The application parses its own bodies; Twisted's form parsing would read a form or
        # multipart upload whole into memory first (and answer a malformed one with a bare 400).
        super().__init__(*args, parsePOSTFormSubmission=False, **kwargs)

    @property
    def config(self) -> ServeConfig:
        return self.server.service.config  # self.server: the LmserveServer (set by daphne)

    def gotLength(self, length):
        path = self._head_path()
        refusal = head_refusal(self.config, path, self._raw_headers(), length)
        if refusal is not None:
            self._refuse(refusal, path)
            if self.requestHeaders.hasHeader(b"Expect"):
                # A client waiting for "100 Continue" sends no body: close now, and send no 100.
                self.requestHeaders.removeHeader(b"Expect")
                self.loseConnection()
        super().gotLength(0 if refusal is not None else length)

    def handleContentChunk(self, data):
        if self.refusal is not None:
            return  # dropped: the answer is out, the connection closes soon
        self.received += len(data)
        limit = self.config.max_body_bytes
        if self.received > limit:
            self._refuse(too_large(limit), self._head_path())
            return
        super().handleContentChunk(data)

    def requestReceived(self, command, path, version):
        if self.refusal is not None:
            self.loseConnection()  # the whole refused body arrived and was dropped
            return
        super().requestReceived(command, path, version)

    def _head_path(self) -> str:
        # Twisted hands the request line to the request only once the body is complete; until
        # then the channel holds it.
        return self.channel._path.split(b"?", 1)[0].decode("latin-1")

    def _raw_headers(self) -> list[tuple[bytes, bytes]]:
        return [
            (name.lower(), value)
            for name, values in self.requestHeaders.getAllRawHeaders()
            for value in values
        ]

    def _refuse(self, error: ApiError, path: str) -> None:
        self.refusal = error
        method = self.channel._command.decode("latin-1")
        logger.info("%s %s %d refused before the body (%s)", method, path, error.status, error.message)
        transport = self.channel.transport
        transport.write(refusal_bytes(error, path, self._raw_headers()))
        count_response(path, error.status)
        reactor.callLater(REFUSAL_LINGER, self._close_lingering)

    def _close_lingering(self) -> None:
        self.loseConnection()  # a no-op once the connection is gone


class GuardedHTTPFactory(HTTPFactory):
    """daphne's HTTP factory building :class:`GuardedRequest` requests."""

    def buildProtocol(self, addr):
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = GuardedRequest
        return protocol
