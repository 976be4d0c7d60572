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

Below the request, :class:`GuardedHTTPChannel` answers what Twisted's HTTP parser refuses by
itself (a garbage request line, a bad ``Content-Length``, both ``Content-Length`` and
``Transfer-Encoding``, a malformed chunk, a broken header line) in the same JSON envelope
instead of Twisted's empty ``400 Bad Request``; a request line over ``REQUEST_LINE_LIMIT`` is a
414 and a head over ``HEAD_LIMIT`` bytes or ``MAX_HEADERS`` fields a 431, where Twisted closed
the connection without a word. Every such answer closes the connection: the parser cannot
know where the next request would begin.

The consumers keep their own checks (``ApiConsumer.check_request``) for the ASGI application
served by anything else (``manage.py runserver``).
"""

from __future__ import annotations

import json
import logging
import re
from http import HTTPStatus

from daphne.http_protocol import HTTPFactory, WebRequest
from twisted.internet import reactor
from twisted.web.http import HTTPChannel, _GenericHTTPChannelProtocol, _MalformedChunkedDataError

from api.auth import check_api_key
from api.errors import ApiError, wants_anthropic_errors
from api.metrics import count_response, count_unparsed
from inference.runtime.service import ServeConfig

logger = logging.getLogger("lmserve.server")

REFUSAL_LINGER = 5.0  # seconds a refused upload may keep sending before the connection closes
# The request head's limits, as nginx's and llama-server's defaults have them: a request line
# (and so a URI) of 8 KiB, and Twisted's own 16 KiB for the line plus all header lines.
REQUEST_LINE_LIMIT = 8192
HEAD_LIMIT = 16384
MAX_HEADERS = 500  # header fields per request (Twisted's default)
MALFORMED = "malformed_request"
TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 5.6.2: methods and field names
HTTP_VERSION = re.compile(rb"HTTP/1\.[01]")


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


def malformed(message: str) -> ApiError:
    return ApiError(400, message, None, MALFORMED)


def uri_too_long() -> ApiError:
    message = f"the request line exceeds the {REQUEST_LINE_LIMIT}-byte limit"
    return ApiError(414, message, None, "uri_too_long")


def head_too_large(why: str) -> ApiError:
    return ApiError(431, f"the request head {why}", None, "request_header_fields_too_large")


def shown(data: bytes, limit: int = 40) -> str:
    """Client bytes quoted in an error message: short, and printable whatever they were."""
    text = data[:limit].decode("latin-1")
    return repr(text + ("..." if len(data) > limit else ""))


def request_line_fault(line: bytes) -> ApiError | None:
    """Why a request line is refused (RFC 9112 section 3), or None for a good one."""
    parts = line.split(b" ")
    if len(parts) != 3:
        return malformed(f"the request line {shown(line)} is not 'METHOD target HTTP/1.1'")
    method, target, version = parts
    if not TOKEN.fullmatch(method):
        return malformed(f"the method {shown(method)} is not a token")
    if not target or any(c <= 32 or c >= 127 for c in target):
        return malformed(f"the request target {shown(target)} is empty or not printable ASCII")
    if not HTTP_VERSION.fullmatch(version):
        return malformed(f"the HTTP version {shown(version)} is not HTTP/1.0 or HTTP/1.1")
    return None


def header_fault(line: bytes) -> ApiError | None:
    """Why a header line is refused (RFC 9110 section 5), or None for a good one."""
    name, colon, value = line.partition(b":")
    if not colon:
        return malformed(f"the header line {shown(line)} has no colon")
    if not TOKEN.fullmatch(name):
        return malformed(f"the header name {shown(name)} is not a token")
    if any(c in b"\x00\r\n" for c in value):
        return malformed(f"the header {shown(name)} has a NUL, CR or LF in its value")
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


class GuardedHTTPChannel(HTTPChannel):
    """Twisted's HTTP/1.1 channel answering the requests it cannot parse with a JSON error.

    Each check runs just before Twisted's own would refuse the same input, so the client learns
    what was wrong; anything Twisted still refuses on its own (a check added in a later
    version) gets a generic JSON 400 through :meth:`_respondToBadRequestAndDisconnect`.
    """

    MAX_LENGTH = HEAD_LIMIT  # any one line; the request line has its own, lower limit
    totalHeadersSize = HEAD_LIMIT
    maxHeaders = MAX_HEADERS
    refused = False
    _linger = None

    def _in_request_line(self) -> bool:
        # Twisted's own parser state: set while it waits for a request line.
        return bool(self._HTTPChannel__first_line)

    def lineReceived(self, line):
        if self.refused:
            return
        if self._in_request_line():
            if not self.persistent:
                return super().lineReceived(line)  # Twisted drops what follows a closing request
            if len(line) > REQUEST_LINE_LIMIT:
                return self._refuse(uri_too_long())
            fault = request_line_fault(line) if line else None
            if fault is not None:
                return self._refuse(fault)
        elif self._receivedHeaderSize + len(line) > self.totalHeadersSize:
            return self._refuse(head_too_large(f"exceeds the {self.totalHeadersSize}-byte limit"))
        return super().lineReceived(line)

    def lineLengthExceeded(self, line):
        if self._in_request_line():
            return self._refuse(uri_too_long())
        return self._refuse(head_too_large(f"has a line over the {self.MAX_LENGTH}-byte limit"))

    def headerReceived(self, line):
        if self._receivedHeaderCount >= self.maxHeaders:
            self._refuse(head_too_large(f"has more than {self.maxHeaders} header fields"))
            return False
        fault = header_fault(line)
        if fault is not None:
            self._refuse(fault)
            return False
        return super().headerReceived(line)

    def _maybeChooseTransferDecoder(self, header, data):
        if header == b"Content-Length":
            if not data.isdigit():
                return self._refuse_framing(malformed(f"Content-Length {shown(data)} is not a byte count"))
        elif header == b"Transfer-Encoding":
            if data.lower() not in (b"chunked", b"identity"):
                error = ApiError(
                    501,
                    f"Transfer-Encoding {shown(data)} is not supported: send chunked or a Content-Length",
                    None,
                    "unsupported_transfer_encoding",
                )
                return self._refuse_framing(error)
            if data.lower() == b"identity":
                return True
        else:
            return True
        if self._transferDecoder is not None:
            # Two framings disagree about where the body ends (request smuggling's opening).
            return self._refuse_framing(
                malformed("the request has more than one Content-Length or Transfer-Encoding: chunked")
            )
        return super()._maybeChooseTransferDecoder(header, data)

    def _refuse_framing(self, error: ApiError) -> bool:
        self._refuse(error)
        self.length = None
        return False

    def rawDataReceived(self, data):
        if self.refused:
            return  # dropped while lingering
        if self._handlingRequest:
            return super().rawDataReceived(data)  # the next request, held back while this one runs
        try:
            self._transferDecoder.dataReceived(data)
        except _MalformedChunkedDataError as error:
            self._refuse(malformed(f"the chunked body is malformed: {error}"))

    def _respondToBadRequestAndDisconnect(self):
        self._refuse(malformed("the request is not valid HTTP/1.1"))

    def _refuse(self, error: ApiError) -> None:
        """Answer ``error`` and close: half-close at once, drop whatever the client still
        sends, and close fully when it closes or after ``REFUSAL_LINGER`` seconds (closing with
        unread input would reset the connection and could destroy the answer unread)."""
        if self.refused:
            return
        self.refused = True
        request = self.requests[-1] if self.requests else None
        # GuardedRequest may have answered this request already (a 413 mid-body): say nothing more.
        if getattr(request, "refusal", None) is None:
            path = self._path.split(b"?", 1)[0].decode("latin-1") if hasattr(self, "_path") else None
            headers = [
                (name.lower(), value)
                for name, values in (request.requestHeaders.getAllRawHeaders() if request else ())
                for value in values
            ]
            self.transport.write(refusal_bytes(error, path or "", headers))
            logger.info("%s %d refused by the HTTP parser (%s)", path or "-", error.status, error.message)
            if path is None:
                count_unparsed(error.status)
            else:
                count_response(path, error.status)
        self.setRawMode()
        self.clearLineBuffer()  # the lines already received are not parsed
        self._networkProducer.unregisterProducer()  # a paused producer would hold the FIN back
        half_close = getattr(self.transport, "loseWriteConnection", None)
        if half_close is not None:
            half_close()
        self._linger = self.callLater(REFUSAL_LINGER, self.transport.loseConnection)

    def connectionLost(self, reason):
        if self._linger is not None and self._linger.active():
            self._linger.cancel()
        super().connectionLost(reason)


class GuardedHTTPFactory(HTTPFactory):
    """daphne's HTTP factory building :class:`GuardedHTTPChannel` channels of
    :class:`GuardedRequest` requests."""

    def protocol(self):
        # Twisted's factory wraps each channel in the proxy that can switch to HTTP/2 after ALPN.
        return _GenericHTTPChannelProtocol(GuardedHTTPChannel())

    def buildProtocol(self, addr):
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = GuardedRequest
        return protocol
