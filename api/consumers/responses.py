"""POST /v1/responses: the Responses parser and encoder over the shared generation flow."""

from __future__ import annotations

from dataclasses import replace

from api.errors import ApiError
from api.protocol.responses import ResponsesRequest
from api.protocol.responses.encoder import ResponsesEncoder

from .generation import EventStreamConsumer


class ResponsesConsumer(EventStreamConsumer):
    """One Responses request, streamed (named SSE events, no [DONE]) or answered whole."""

    def parse(self, body: dict):
        return ResponsesRequest.parse(body)

    def generation(self, request: ResponsesRequest):
        return request.to_generation(self.service.supports_reasoning, self.service.supports_tools)

    def encoder(self, request: ResponsesRequest) -> ResponsesEncoder:
        return ResponsesEncoder(self.service.model_id, request)

    async def send_error(self, error: ApiError) -> None:
        # The backend names the conversation 'messages'; on this endpoint it is 'input'.
        if error.param == "messages":
            error = replace(error, param="input")
        await super().send_error(error)
