"""The flow every generating endpoint shares: parse, validate, enqueue, then encode the
worker's events in the endpoint's dialect (a stream, or one object at the end).

A dialect consumer supplies the parser, the mapping onto the dialect-free GenerationRequest
and its encoders; queueing, cancellation and the start of streams live here. Dialects whose
streams are named events (Responses, Anthropic Messages) only supply an EventEncoder.

A stream starts lazily, with the first event, so a failure that comes fast (a full queue, a
bad grammar) is still a plain JSON error. A streamed request that waits longer than
``--stream-start-after`` (in the queue or in prefill) starts its stream anyway, and any open
stream sends a keep-alive every ``--keepalive`` seconds without events: clients with idle
timeouts (Claude Code, proxies) then wait instead of giving up and retrying.

A reply served behind a fleet's composed KV prefix names the documents it used in the
``x-lmserve-documents`` header (comma-separated, selection order), streamed or not. The worker
picks them before the first event; a stream with a prefix source therefore opens early only
once they are known, so its headers can carry them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

from api.errors import ApiError
from api.metrics import MeteredPipe, endpoint_label
from api.protocol.fields import parse_json_object
from api.sse import SSE_HEADERS, event_frame
from inference.runtime.pipe import StreamPipe
from inference.runtime.queue import Job
from inference.types import (
    Error,
    Event,
    Finish,
    GenerationRequest,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
)

from .base import ApiConsumer


@dataclass(frozen=True)
class Reply:
    """A whole reply collected from the pipe; ``end`` is None if it ended without a final event."""

    text: str
    reasoning: str
    end: Finish | Error | None
    calls: tuple[ToolCallDelta, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()  # the reply text's tokens, when they were asked for


async def collect_reply(pipe: StreamPipe, event: Event | None) -> Reply:
    """Read the pipe to its end, starting with the already received ``event``."""
    text, reasoning, calls, logprobs = [], [], [], []
    while isinstance(event, (TextDelta, ReasoningDelta, ToolCallDelta)):
        if isinstance(event, ToolCallDelta):
            calls.append(event)
        elif isinstance(event, TextDelta):
            text.append(event.text)
            logprobs += event.logprobs
        else:
            reasoning.append(event.text)
        event = await pipe.get()
    return Reply("".join(text), "".join(reasoning), event, tuple(calls), tuple(logprobs))


def failure(event: Event | None) -> ApiError:
    """The error a reply that did not finish normally is answered with."""
    if isinstance(event, Error):
        return ApiError.from_event(event)
    return ApiError(500, "the reply ended without a finish event", None, "internal_error")


DOCUMENTS_HEADER = b"x-lmserve-documents"
# A document name is sent as is when it is printable ASCII; anything else (and the comma that
# separates names) is percent-encoded, as header values are ASCII.
NAME_SAFE = " !\"#$&'()*+-./:;<=>?@[\\]^_`{|}~"


def documents_header(documents: tuple[str, ...]) -> list[tuple[bytes, bytes]]:
    """The header naming the fleet documents a reply used (none when it used none)."""
    if not documents:
        return []
    return [(DOCUMENTS_HEADER, ",".join(quote(name, safe=NAME_SAFE) for name in documents).encode("ascii"))]


class GenerationConsumer(ApiConsumer):
    """Subclasses implement ``parse``, ``generation``, ``complete`` and ``stream``; parsed
    requests have a ``stream`` attribute."""

    methods = ("POST",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.job: Job | None = None

    def parse(self, body: dict) -> Any:
        """The validated dialect request, or an ApiError."""
        raise NotImplementedError

    def generation(self, request: Any) -> GenerationRequest | ApiError:
        """The dialect-free request (the model is loaded: its capabilities are known)."""
        raise NotImplementedError

    async def complete(self, request: Any, pipe: StreamPipe, first: Event | None) -> None:
        """Answer with one object once the reply is complete."""
        raise NotImplementedError

    async def stream(self, request: Any, pipe: StreamPipe, first: Event | None) -> None:
        """Answer with a stream of events, starting with ``first``."""
        raise NotImplementedError

    async def respond(self, body: bytes) -> None:
        parsed = parse_json_object(body)
        request = parsed if isinstance(parsed, ApiError) else self.parse(parsed)
        if isinstance(request, ApiError):
            await self.send_error(request)
            return
        pipe = await self._enqueue(request)
        if pipe is None:
            return
        try:
            first = await self.next_event(request, pipe) if request.stream else await pipe.get()
            if isinstance(first, Error) and not self._headers_sent:
                await self.send_error(ApiError.from_event(first))
            elif request.stream:
                await self.stream(request, pipe, first)
            else:
                await self.complete(request, pipe, first)
        finally:
            if not self._answered and self.job is not None:
                self.service.cancel(self.job)

    def client_gone(self) -> None:
        if self.job is not None:
            self.service.cancel(self.job)

    # -- the documents header ----------------------------------------------------------------
    def reply_headers(self) -> list[tuple[bytes, bytes]]:
        """Headers of a successful reply: the fleet documents its prefix composed, if any."""
        return documents_header(self.job.pipe.documents) if self.job is not None else []

    async def send_json(self, status: int, payload: dict, headers: list[tuple[bytes, bytes]] = ()) -> None:
        extra = self.reply_headers() if status == 200 else []
        await super().send_json(status, payload, [*headers, *extra])

    async def start_stream(self, headers: list[tuple[bytes, bytes]]) -> None:
        await super().start_stream([*headers, *self.reply_headers()])

    # -- streams ---------------------------------------------------------------------------
    def opening_frames(self, request: Any) -> bytes:
        """The frames a stream starts with (before any reply text)."""
        return b""

    def keepalive_frame(self) -> bytes:
        """What an idle open stream sends: an SSE comment, which every SSE reader skips."""
        return b": keep-alive\n\n"

    async def open_stream(self, request: Any) -> None:
        """Send the stream's headers and opening frames, once."""
        if self._headers_sent:
            return
        await self.start_stream(SSE_HEADERS)
        opening = self.opening_frames(request)
        if opening:
            await self.send_chunk(opening)

    async def next_event(self, request: Any, pipe: StreamPipe) -> Event | None:
        """The next event of a streamed reply. While none comes, the stream is opened after
        ``stream_start_after`` seconds and kept alive every ``keepalive_every`` seconds."""
        config = self.service.config
        waiting = asyncio.ensure_future(pipe.get())
        try:
            while True:
                delay = config.keepalive_every if self._headers_sent else config.stream_start_after
                done, _ = await asyncio.wait({waiting}, timeout=delay)
                if done:
                    return waiting.result()
                if self._headers_sent:
                    await self.send_chunk(self.keepalive_frame())
                elif not self.service.chooses_prefix or pipe.prefix_known:
                    await self.open_stream(request)
        finally:
            waiting.cancel()  # the request itself was cancelled (no-op once done)

    async def _enqueue(self, request: Any) -> StreamPipe | None:
        """Validate against the model and queue the job; None once an error was sent."""
        down = self.service.unavailable()
        generation = ApiError.from_event(down) if down is not None else self.generation(request)
        if isinstance(generation, ApiError):
            await self.send_error(generation)
            return None
        prepared = await self.service.prepare(generation)
        if isinstance(prepared, Error):
            await self.send_error(ApiError.from_event(prepared))
            return None
        pipe = MeteredPipe(asyncio.get_running_loop(), endpoint_label(self.scope["path"]))
        job = self.service.submit(generation, prepared, pipe)
        if isinstance(job, Error):
            await self.send_error(ApiError.from_event(job))
            return None
        self.job = job
        return pipe


class EventEncoder(Protocol):
    """A dialect encoder that builds named stream events and the final object alongside."""

    @property
    def final(self) -> dict: ...

    def start(self) -> list[dict]: ...

    def delta(self, event: TextDelta | ReasoningDelta | ToolCallDelta) -> list[dict]: ...

    def finish(self, finish: Finish) -> list[dict]: ...

    def fail(self, error: ApiError) -> list[dict]: ...

    def keepalive(self) -> list[dict]:
        """The events an open stream sends while it waits (prefill, queue) for the next one."""
        ...


def event_frames(events: list[dict]) -> bytes:
    """Named SSE frames; each event's ``type`` is its name."""
    return b"".join(event_frame(event["type"], event) for event in events)


class EventStreamConsumer(GenerationConsumer):
    """The dialects whose streams are named events (Responses, Anthropic Messages): a
    non-streamed reply runs through the same encoder and answers with its final object."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._stream_encoder: EventEncoder | None = None

    def encoder(self, request: Any) -> EventEncoder:
        raise NotImplementedError

    async def complete(self, request: Any, pipe: StreamPipe, event: Event | None) -> None:
        encoder = self.encoder(request)
        while isinstance(event, (TextDelta, ReasoningDelta, ToolCallDelta)):
            encoder.delta(event)
            event = await pipe.get()
        if isinstance(event, Finish):
            encoder.finish(event)
            await self.send_json(200, encoder.final)
        else:
            await self.send_error(failure(event))

    def stream_encoder(self, request: Any) -> EventEncoder:
        """The encoder of this request's stream (made once: the stream may open early)."""
        if self._stream_encoder is None:
            self._stream_encoder = self.encoder(request)
        return self._stream_encoder

    def opening_frames(self, request: Any) -> bytes:
        return event_frames(self.stream_encoder(request).start())

    def keepalive_frame(self) -> bytes:
        """The dialect's own keep-alive events: a client whose idle watchdog counts events
        (not bytes) must see some while a long prompt prefills."""
        return event_frames(self._stream_encoder.keepalive())

    async def stream(self, request: Any, pipe: StreamPipe, event: Event | None) -> None:
        encoder = self.stream_encoder(request)
        await self.open_stream(request)
        while isinstance(event, (TextDelta, ReasoningDelta, ToolCallDelta)):
            await self.send_chunk(event_frames(encoder.delta(event)))
            event = await self.next_event(request, pipe)
        if isinstance(event, Finish):
            await self.end_stream(event_frames(encoder.finish(event)))
        else:
            # Mid-stream failure: in-band, in the dialect's own failure events.
            await self.end_stream(event_frames(encoder.fail(failure(event))))
