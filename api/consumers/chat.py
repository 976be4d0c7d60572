"""POST /v1/chat/completions: parse, validate, enqueue, then encode the worker's events."""

from __future__ import annotations

import asyncio

from api.errors import ApiError
from api.protocol.chat import ChatCompletionRequest, ChatEncoder
from api.protocol.fields import parse_json_object
from api.sse import SSE_HEADERS, data_frame
from inference.pipe import StreamPipe
from inference.queue import Job
from inference.types import Error, Event, Finish, TextDelta

from .base import ApiConsumer


class ChatCompletionsConsumer(ApiConsumer):
    """One Chat Completions request, streamed (SSE) or answered whole."""

    methods = ("POST",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.job: Job | None = None

    async def respond(self, body: bytes) -> None:
        parsed = parse_json_object(body)
        request = parsed if isinstance(parsed, ApiError) else ChatCompletionRequest.parse(parsed)
        if isinstance(request, ApiError):
            await self.send_error(request)
            return
        pipe = await self._enqueue(request)
        if pipe is None:
            return
        try:
            # Nothing is sent before the first event: an early failure is still a plain JSON error.
            first = await pipe.get()
            if isinstance(first, Error):
                await self.send_error(ApiError.from_event(first))
            elif request.stream:
                await self._stream(request, pipe, first)
            else:
                await self._complete(pipe, first)
        finally:
            if not self._answered and self.job is not None:
                self.service.cancel(self.job)

    def client_gone(self) -> None:
        if self.job is not None:
            self.service.cancel(self.job)

    async def _enqueue(self, request: ChatCompletionRequest) -> StreamPipe | None:
        """Validate against the model and queue the job; None once an error was sent."""
        generation = request.to_generation()
        prepared = await self.service.prepare(generation)
        if isinstance(prepared, Error):
            await self.send_error(ApiError.from_event(prepared))
            return None
        pipe = StreamPipe(asyncio.get_running_loop())
        job = self.service.submit(generation, prepared, pipe)
        if isinstance(job, Error):
            await self.send_error(ApiError.from_event(job))
            return None
        self.job = job
        return pipe

    async def _complete(self, pipe: StreamPipe, event: Event | None) -> None:
        encoder = ChatEncoder(self.service.model_id)
        parts = []
        while isinstance(event, TextDelta):
            parts.append(event.text)
            event = await pipe.get()
        if isinstance(event, Finish):
            await self.send_json(200, encoder.completion("".join(parts), event.reason, event.usage))
        else:
            await self.send_error(self._failure(event))

    async def _stream(self, request: ChatCompletionRequest, pipe: StreamPipe, event: Event | None) -> None:
        encoder = ChatEncoder(self.service.model_id)
        await self.start_stream(SSE_HEADERS)
        while isinstance(event, TextDelta):
            await self.send_chunk(data_frame(encoder.delta_chunk(event.text)))
            event = await pipe.get()
        if not isinstance(event, Finish):
            # Mid-stream failure: in-band, as a data frame with a top-level error key.
            await self.end_stream(data_frame(self._failure(event).openai_payload()))
            return
        frames = [data_frame(encoder.finish_chunk(event.reason))]
        if request.include_usage:
            frames.append(data_frame(encoder.usage_chunk(event.usage)))
        frames.append(data_frame("[DONE]"))
        await self.end_stream(b"".join(frames))

    @staticmethod
    def _failure(event: Event | None) -> ApiError:
        if isinstance(event, Error):
            return ApiError.from_event(event)
        return ApiError(500, "the reply ended without a finish event", None, "internal_error")
