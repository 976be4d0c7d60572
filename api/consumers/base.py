"""The base of every API consumer: method, auth and body-size checks, JSON replies, and
responses produced by a separate task so that a client hang-up is noticed at once.

Channels dispatches a consumer's messages one at a time, so a response produced inside the
``http.request`` handler would hide ``http.disconnect`` until it ended (and sending to a gone
client raises nothing). Here the handler only starts a task and returns; ``http.disconnect``
then arrives immediately and cancels the request's work. The request body is counted as its
chunks arrive and refused with 413 past the limit instead of being collected whole.
"""

from __future__ import annotations

import asyncio
import json
import logging

from channels.exceptions import StopConsumer
from channels.generic.http import AsyncHttpConsumer

from api.auth import check_api_key
from api.errors import ApiError, wants_anthropic_errors
from inference.runtime import service as services

logger = logging.getLogger("lmserve.api")

JSON_HEADERS = [(b"content-type", b"application/json")]


def is_json_media_type(content_type: str | None) -> bool:
    """``application/json`` or a ``+json`` type, parameters (charset) aside."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def not_json(content_type: str | None) -> ApiError:
    """415: a body a browser may send cross-site without a preflight (text/plain, forms) is not
    taken for JSON, which closes that door to DNS-rebinding and CSRF requests."""
    given = f"'{content_type}'" if content_type else "no Content-Type"
    return ApiError(
        415,
        f"the request body must be JSON sent as 'Content-Type: application/json', not {given}",
        None,
        "unsupported_media_type",
    )


class ApiConsumer(AsyncHttpConsumer):
    """Subclasses set ``methods`` and implement ``respond(body)``."""

    methods: tuple[str, ...] = ("GET",)
    needs_auth = True  # --api-key applies (everything but /health)
    # API consumers use no channel layer; an unconfigured alias skips creating a channel per request.
    channel_layer_alias = "lmserve-api-no-layer"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._body = bytearray()
        self._answered = False  # a complete response was sent (or the request was refused)
        self._headers_sent = False
        self._task: asyncio.Task | None = None

    @property
    def service(self) -> services.InferenceService:
        return services.current()

    # -- the ASGI messages -----------------------------------------------------------------
    async def dispatch(self, message):
        # The base class closes stale DB connections around every message; we use no DB.
        handler = getattr(self, message["type"].replace(".", "_"), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        await handler(message)

    async def http_request(self, message):
        if self._answered or self._task is not None:
            return
        if not self._body:
            refusal = self.check_request()
            if refusal is not None:
                await self.send_error(refusal)
                return
        self._body += message.get("body", b"")
        if len(self._body) > self.service.config.max_body_bytes:
            await self.send_error(self.too_large())
            return
        if not message.get("more_body"):
            self._task = asyncio.create_task(self._run(bytes(self._body)))
            self._body = bytearray()

    async def http_disconnect(self, message):
        if self._task is not None and not self._task.done():
            self.client_gone()
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        raise StopConsumer()

    # -- checks before the body ------------------------------------------------------------
    def check_request(self) -> ApiError | None:
        """Method, auth and declared length, all decidable from the head alone."""
        method = self.scope["method"]
        if method not in self.methods:
            allowed = ", ".join(self.methods)
            return ApiError(
                405,
                f"method {method} is not allowed on {self.scope['path']} (allowed: {allowed})",
                None,
                "method_not_allowed",
                allow=self.methods,
            )
        if self.needs_auth:
            refusal = check_api_key(self.service.config.api_key, self.scope["headers"])
            if refusal is not None:
                return refusal
        if method == "POST" and not is_json_media_type(self.header(b"content-type")):
            return not_json(self.header(b"content-type"))
        declared = self.header(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.service.config.max_body_bytes:
            return self.too_large()
        return None

    def too_large(self) -> ApiError:
        limit = self.service.config.max_body_bytes
        return ApiError(413, f"the request body exceeds the {limit}-byte limit", None, "request_too_large")

    def header(self, name: bytes) -> str | None:
        for key, value in self.scope["headers"]:
            if key.lower() == name:
                return value.decode("latin-1")
        return None

    # -- the response task -----------------------------------------------------------------
    async def _run(self, body: bytes) -> None:
        try:
            await self.respond(body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("%s %s failed", self.scope["method"], self.scope["path"])
            error = ApiError(500, f"internal error: {type(exc).__name__}: {exc}", None, "internal_error")
            if not self._headers_sent:
                await self.send_error(error)
            elif not self._answered:
                await self.end_stream()

    async def respond(self, body: bytes) -> None:
        """Produce the whole response (runs as its own task)."""
        raise NotImplementedError

    def client_gone(self) -> None:
        """The client hung up while ``respond`` ran: stop its work. Subclasses extend."""

    # -- sending ---------------------------------------------------------------------------
    async def send_json(self, status: int, payload: dict, headers: list[tuple[bytes, bytes]] = ()) -> None:
        body = json.dumps(payload, ensure_ascii=False).encode()
        self._headers_sent = True
        self._answered = True
        length = (b"content-length", str(len(body)).encode())
        await self.send_response(status, body, headers=[*JSON_HEADERS, length, *headers])

    def error_payload(self, error: ApiError) -> dict:
        """``error`` in the envelope of the dialect the client speaks."""
        if wants_anthropic_errors(self.scope["path"], self.scope["headers"]):
            return error.anthropic_payload()
        return error.openai_payload()

    async def send_error(self, error: ApiError) -> None:
        await self.send_json(error.status, self.error_payload(error), error.headers())

    async def start_stream(self, headers: list[tuple[bytes, bytes]]) -> None:
        self._headers_sent = True
        await self.send_headers(status=200, headers=headers)

    async def send_chunk(self, data: bytes) -> None:
        await self.send_body(data, more_body=True)

    async def end_stream(self, data: bytes = b"") -> None:
        self._answered = True
        await self.send_body(data, more_body=False)
