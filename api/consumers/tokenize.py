"""POST /tokenize and POST /detokenize (llama.cpp's shapes): the loaded model's tokenizer,
run off the event loop; no worker, no queue."""

from __future__ import annotations

import asyncio

from api.errors import ApiError, unsupported
from api.protocol.fields import parse_json_object
from api.protocol.tokenize import DetokenizeRequest, TokenizeRequest, detokenize, tokenize

from .base import ApiConsumer


class TokenizerConsumer(ApiConsumer):
    """Parse the body with ``request_type``, answer with ``answer(tokenizer, request)``."""

    methods = ("POST",)
    request_type: type = TokenizeRequest
    param = "content"

    @staticmethod
    def answer(tokenizer, request):
        return tokenize(tokenizer, request)

    async def respond(self, body: bytes) -> None:
        parsed = parse_json_object(body)
        request = parsed if isinstance(parsed, ApiError) else self.request_type.parse(parsed)
        if isinstance(request, ApiError):
            await self.send_error(request)
            return
        down = self.service.unavailable()
        if down is not None:
            await self.send_error(ApiError.from_event(down))
            return
        engine = self.service.worker.backend.engine
        if engine is None:  # a nanochat checkpoint: its tokenizer is not a GGUF vocabulary
            await self.send_error(unsupported(self.param, "is not served for a nanochat checkpoint"))
            return
        # The tokenizer is only read (its piece cache fills idempotently): safe beside the worker.
        answer = await asyncio.to_thread(self.answer, engine.tokenizer, request)
        if isinstance(answer, ApiError):
            await self.send_error(answer)
        else:
            await self.send_json(200, answer)


class DetokenizeConsumer(TokenizerConsumer):
    request_type = DetokenizeRequest
    param = "tokens"

    @staticmethod
    def answer(tokenizer, request):
        return detokenize(tokenizer, request)
