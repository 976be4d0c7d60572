"""POST /v1/completions: OpenAI's legacy Completions (a raw prompt, no chat template) over the
shared generation flow."""

from __future__ import annotations

from functools import cached_property

from api.protocol.completions import CompletionRequest, CompletionsEncoder
from api.sse import data_frame
from inference.runtime.pipe import StreamPipe
from inference.types import Event, Finish, GenerationRequest, TextDelta

from .generation import GenerationConsumer, collect_reply, failure


class CompletionsConsumer(GenerationConsumer):
    """One Completions request, streamed (SSE text_completion chunks) or answered whole."""

    @cached_property
    def encoder(self) -> CompletionsEncoder:
        return CompletionsEncoder(self.service.model_id)

    def parse(self, body: dict):
        return CompletionRequest.parse(body)

    def generation(self, request: CompletionRequest) -> GenerationRequest:
        return request.to_generation()

    def echoed(self, request: CompletionRequest) -> str:
        """What ``echo`` puts before the reply: the prompt as sent (token ids as their text)."""
        if not request.echo:
            return ""
        if request.prompt_tokens is None:
            return request.prompt
        return self.service.worker.backend.engine.tokenizer.decode(request.prompt_tokens)

    async def complete(self, request: CompletionRequest, pipe: StreamPipe, first: Event | None) -> None:
        reply = await collect_reply(pipe, first)
        if isinstance(reply.end, Finish):
            echoed = self.echoed(request)
            logprobs = reply.logprobs if request.logprobs is not None else None
            body = self.encoder.completion(
                echoed + reply.text, reply.end.reason, reply.end.usage, logprobs, len(echoed)
            )
            await self.send_json(200, body)
        else:
            await self.send_error(failure(reply.end))

    def opening_frames(self, request: CompletionRequest) -> bytes:
        """A stream opens with the echoed prompt, if asked for."""
        echoed = self.echoed(request)
        return data_frame(self.encoder.chunk(echoed)) if echoed else b""

    async def stream(self, request: CompletionRequest, pipe: StreamPipe, event: Event | None) -> None:
        encoder = self.encoder
        await self.open_stream(request)
        offset = len(self.echoed(request))  # the text_offset of the reply's first token
        while isinstance(event, TextDelta):
            logprobs = event.logprobs if request.logprobs is not None else None
            await self.send_chunk(data_frame(encoder.chunk(event.text, logprobs=logprobs, offset=offset)))
            offset += sum(len(record.text) for record in event.logprobs)
            event = await self.next_event(request, pipe)
        if not isinstance(event, Finish):
            # Mid-stream failure: in-band, as a data frame with a top-level error key.
            await self.end_stream(data_frame(failure(event).openai_payload()))
            return
        frames = [data_frame(encoder.chunk("", event.reason))]
        if request.include_usage:
            frames.append(data_frame(encoder.usage_chunk(event.usage)))
        frames.append(data_frame("[DONE]"))
        await self.end_stream(b"".join(frames))
