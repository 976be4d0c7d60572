"""Lockstep batches (``--batch N``): several requests decoded together, one weight pass per step.

Decoding is memory-bound here: a step of one token row reads every weight once, and a step of
N rows (``Engine.decode_batch``) reads them once too, so N streams advance for little more
than the price of one. Each request keeps its own :class:`~inference.generation.stream.DecodeStream`
(slot, sampler, grammar, emitter, budget, sink), so a batched reply is byte for byte the reply
the plain loop gives: the engine's rows are path invariant, and everything else is per stream.

Streams are opened one after another: each picks its slot, prefills and streams its first
token before the next is opened, so the first stream's time to first token is what it would be
alone. A stream that ends (its reply finished, its client left, its grammar completed or
failed) drops out of the next step and gives its slot back. Requests that arrive while a batch
runs join it between two steps (:class:`Joins`: continuous batching, as llama.cpp's server
does), up to the batch's width: a burst of N requests at an idle server decodes N wide after
the first one's prefill, not one, then N - 1. A joining stream's prefill delays the others' next
token by that prefill, once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from inference.engine.engine import BatchRow, Engine
from inference.generation.stream import BatchItem, DecodeStream
from inference.types import Error, GenerationRequest, PreparedPrompt, Sink

logger = logging.getLogger("lmserve.lockstep")


class LockstepHost(Protocol):
    """What a lockstep batch needs of its backend (ConversationBackend, which imports this
    module): the engine that runs the batch's forward, and the streams it opens."""

    engine: Engine

    def open_stream(
        self, request: GenerationRequest, prompt: PreparedPrompt, sink: Sink
    ) -> DecodeStream | None: ...

    def end_stream(self, stream: DecodeStream) -> None: ...


@dataclass(frozen=True)
class Joins:
    """Where requests that arrive during a batch come from: ``take(room)`` returns up to
    ``room`` of them (none when nothing waits), asked between steps while fewer than ``width``
    streams are live. ``ended``, if given, is told each stream's token count as it ends: a
    batch that joins can run for as long as the load lasts, and a counter summed only at its
    end (the worker's, which /health reports) would stand still meanwhile."""

    take: Callable[[int], Sequence[BatchItem]]
    width: int
    ended: Callable[[int], None] | None = None


def run_lockstep(backend: LockstepHost, items: Sequence[BatchItem], joins: Joins | None = None) -> list[int]:
    """Generate every item's reply into its sink, and those of the requests that join; the
    tokens each stream generated, in the order the streams were opened. Under steady load
    joins keep a batch running for as long as the load lasts, so nothing here keeps a stream
    once it has ended (only its token count)."""
    generated: list[int] = []  # per opened item; a stream's count is written when it ends
    live: list[tuple[int, DecodeStream]] = []  # (its place in generated, the stream)

    def finish(at: int, stream: DecodeStream) -> None:
        generated[at] = stream.generated
        backend.end_stream(stream)
        if joins is not None and joins.ended is not None:
            joins.ended(stream.generated)

    def open_all(batch: Sequence[BatchItem]) -> None:
        for item in batch:
            stream = open_stream(backend, item)
            generated.append(0)
            if stream is None:
                continue
            if stream.live:
                live.append((len(generated) - 1, stream))
            else:  # ended at its first token
                finish(len(generated) - 1, stream)

    open_all(items)
    while live:
        step(backend, [stream for _, stream in live])
        for at, stream in live:
            if not stream.live:
                finish(at, stream)
        live[:] = [(at, stream) for at, stream in live if stream.live]
        if joins is not None and len(live) < joins.width:
            open_all(joins.take(joins.width - len(live)))
    return generated


def open_stream(backend: LockstepHost, item: BatchItem) -> DecodeStream | None:
    """The item's stream, prefilled with its first token taken; None when its client left
    while it was queued (no slot, no prefill) or its slot could not be had (its sink then
    carries the error; the batch goes on without it)."""
    if item.sink.cancelled:
        return None
    try:
        return backend.open_stream(item.request, item.prompt, item.sink)
    except Exception as exc:
        logger.exception("a lockstep stream could not start")
        item.sink.close(Error(500, f"generation failed: {type(exc).__name__}: {exc}", code="internal_error"))
        return None


def step(backend: LockstepHost, live: list[DecodeStream]) -> None:
    """Append each live stream's token to its cache in one forward and let each stream take
    its next token. A forward that fails fails every stream in it (each reports the error)."""
    rows = [BatchRow(stream.cache, stream.token) for stream in live]
    try:
        logits = backend.engine.decode_batch(rows)  # (len(live), vocab)
    except Exception as exc:
        for stream in live:
            stream.fail(exc)
        return
    for stream, row in zip(live, logits, strict=True):
        stream.advance(row)
