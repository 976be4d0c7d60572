"""POST /infill: llama.cpp's fill-in-the-middle endpoint (llama.vscode, and other editors
written for llama-server) over the shared generation flow."""

from __future__ import annotations

import time
from functools import cached_property

from api.protocol.infill import InfillEncoder, InfillRequest
from api.protocol.infill.encoder import Timings
from api.sse import data_frame
from inference.runtime.pipe import StreamPipe
from inference.types import Event, Finish, GenerationRequest, TextDelta

from .generation import GenerationConsumer, collect_reply, failure


def timings(pipe: StreamPipe) -> Timings:
    """The reply's times as its (metered) pipe saw them."""
    now = time.perf_counter()
    queued = getattr(pipe, "queued_at", now)
    first = getattr(pipe, "first_event_at", None) or now
    return Timings((first - queued) * 1000.0, (now - first) * 1000.0)


class InfillConsumer(GenerationConsumer):
    """One /infill request, answered whole or streamed as llama.cpp streams it."""

    @cached_property
    def encoder(self) -> InfillEncoder:
        return InfillEncoder(self.service.model_id)

    def parse(self, body: dict):
        return InfillRequest.parse(body)

    def generation(self, request: InfillRequest) -> GenerationRequest:
        return request.to_generation()

    async def complete(self, request: InfillRequest, pipe: StreamPipe, first: Event | None) -> None:
        reply = await collect_reply(pipe, first)
        if isinstance(reply.end, Finish):
            await self.send_json(200, self.encoder.final(reply.text, reply.end, timings(pipe)))
        else:
            await self.send_error(failure(reply.end))

    async def stream(self, request: InfillRequest, pipe: StreamPipe, event: Event | None) -> None:
        await self.open_stream(request)
        while isinstance(event, TextDelta):
            await self.send_chunk(data_frame(self.encoder.chunk(event.text)))
            event = await self.next_event(request, pipe)
        if isinstance(event, Finish):
            await self.end_stream(data_frame(self.encoder.final("", event, timings(pipe))))
        else:
            await self.end_stream(data_frame(failure(event).openai_payload()))
