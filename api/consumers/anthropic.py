"""POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages dialect.

Errors on these endpoints use the Anthropic envelope (ApiConsumer.error_payload)."""

from __future__ import annotations

from api.errors import ApiError
from api.protocol.anthropic import MessagesRequest
from api.protocol.anthropic.encoder import MessagesEncoder
from api.protocol.fields import parse_json_object
from inference.types import Error

from .base import ApiConsumer
from .generation import EventStreamConsumer


class MessagesConsumer(EventStreamConsumer):
    """One Messages request, streamed (named SSE events, no [DONE]) or answered whole."""

    def parse(self, body: dict):
        return MessagesRequest.parse(body)

    def generation(self, request: MessagesRequest):
        return request.to_generation(self.service.supports_reasoning, self.service.supports_tools)

    def encoder(self, request: MessagesRequest) -> MessagesEncoder:
        return MessagesEncoder(self.service.model_id)


class CountTokensConsumer(ApiConsumer):
    """POST /v1/messages/count_tokens: ``{"input_tokens": N}``, the prompt the request's
    system and messages render to (whether or not it fits the context)."""

    methods = ("POST",)

    async def respond(self, body: bytes) -> None:
        parsed = parse_json_object(body)
        request = parsed if isinstance(parsed, ApiError) else MessagesRequest.parse(parsed, count_only=True)
        if isinstance(request, ApiError):
            await self.send_error(request)
            return
        counted = await self.service.count_tokens(
            request.to_generation(self.service.supports_reasoning, self.service.supports_tools)
        )
        if isinstance(counted, Error):
            await self.send_error(ApiError.from_event(counted))
            return
        await self.send_json(200, {"input_tokens": counted})
