"""POST /v1/chat/completions: the Chat Completions parser and encoders over the shared flow."""

from __future__ import annotations

from functools import cached_property

from api.errors import ApiError
from api.protocol.chat import ChatCompletionRequest, ChatEncoder
from api.sse import data_frame
from inference.runtime.pipe import StreamPipe
from inference.types import Event, Finish, GenerationRequest, ReasoningDelta, TextDelta, ToolCallDelta

from .generation import GenerationConsumer, collect_reply, failure


class ChatCompletionsConsumer(GenerationConsumer):
    """One Chat Completions request, streamed (SSE) or answered whole."""

    @cached_property
    def stream_encoder(self) -> ChatEncoder:
        return ChatEncoder(self.service.model_id)

    def parse(self, body: dict):
        return ChatCompletionRequest.parse(body)

    def generation(self, request: ChatCompletionRequest) -> GenerationRequest | ApiError:
        return request.to_generation(self.service.supports_reasoning, self.service.supports_tools)

    async def complete(self, request: ChatCompletionRequest, pipe: StreamPipe, first: Event | None) -> None:
        encoder = ChatEncoder(self.service.model_id)
        reply = await collect_reply(pipe, first)
        if isinstance(reply.end, Finish):
            end, logprobs = reply.end, reply.logprobs if request.logprobs else None
            payload = encoder.completion(
                reply.text, end.reason, end.usage, reply.reasoning, reply.calls, logprobs
            )
            await self.send_json(200, payload)
        else:
            await self.send_error(failure(reply.end))

    def opening_frames(self, request: ChatCompletionRequest) -> bytes:
        """A stream opened before the first token starts with the role chunk, as OpenAI's do."""
        return data_frame(self.stream_encoder.role_chunk())

    async def stream(self, request: ChatCompletionRequest, pipe: StreamPipe, event: Event | None) -> None:
        encoder = self.stream_encoder
        await self.open_stream(request)
        while isinstance(event, (TextDelta, ReasoningDelta, ToolCallDelta)):
            if isinstance(event, ToolCallDelta):
                await self.send_chunk(data_frame(encoder.tool_call_chunk(event)))
            elif isinstance(event, TextDelta):
                logprobs = event.logprobs if request.logprobs else None
                await self.send_chunk(data_frame(encoder.delta_chunk(event.text, "content", logprobs)))
            else:
                await self.send_chunk(data_frame(encoder.delta_chunk(event.text, "reasoning_content")))
            event = await self.next_event(request, pipe)
        if not isinstance(event, Finish):
            # Mid-stream failure: in-band, as a data frame with a top-level error key.
            await self.end_stream(data_frame(failure(event).openai_payload()))
            return
        frames = [data_frame(encoder.finish_chunk(event.reason))]
        if request.include_usage:
            frames.append(data_frame(encoder.usage_chunk(event.usage)))
        frames.append(data_frame("[DONE]"))
        await self.end_stream(b"".join(frames))
