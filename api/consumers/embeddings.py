"""POST /v1/embeddings: OpenAI's Embeddings, queued through the one worker."""

from __future__ import annotations

import asyncio

from api.errors import ApiError
from api.metrics import MeteredPipe, endpoint_label
from api.protocol.embeddings import EmbeddingsEncoder, EmbeddingsRequest
from api.protocol.fields import parse_json_object
from inference.runtime.queue import Job
from inference.types import Embeddings, Error

from .base import ApiConsumer
from .generation import failure


class EmbeddingsConsumer(ApiConsumer):
    """One embeddings request: parse, tokenize, queue, answer with the vectors."""

    methods = ("POST",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.job: Job | None = None

    async def respond(self, body: bytes) -> None:
        parsed = parse_json_object(body)
        request = parsed if isinstance(parsed, ApiError) else EmbeddingsRequest.parse(parsed)
        if isinstance(request, ApiError):
            await self.send_error(request)
            return
        result = await self._embed(request)
        if isinstance(result, Embeddings):
            await self.send_json(
                200, EmbeddingsEncoder(self.service.model_id).response(result, request.encoding_format)
            )
        else:
            await self.send_error(result)

    async def _embed(self, request: EmbeddingsRequest) -> Embeddings | ApiError:
        down = self.service.unavailable()
        if down is not None:
            return ApiError.from_event(down)
        down = self.service.embeddings_unavailable()
        if down is not None:
            return ApiError.from_event(down)
        refused = request.check_dimensions(self.service.worker.backend.engine.config.n_embd)
        if refused is not None:
            return refused
        embedding = request.to_embedding()
        prepared = await self.service.prepare_embedding(embedding)
        if isinstance(prepared, Error):
            return ApiError.from_event(prepared)
        pipe = MeteredPipe(asyncio.get_running_loop(), endpoint_label(self.scope["path"]))
        job = self.service.submit(embedding, prepared, pipe)
        if isinstance(job, Error):
            return ApiError.from_event(job)
        self.job = job
        result = await pipe.get()
        return result if isinstance(result, Embeddings) else failure(result)

    def client_gone(self) -> None:
        if self.job is not None:
            self.service.cancel(self.job)
