"""One request's decoding state, shared by the plain loop and the lockstep batch loop.

A :class:`DecodeStream` owns everything that makes a reply that request's own: its KV cache
(a slot), sampler and RNG, token history, grammar, reply emitter (think routing, tool calls,
stop strings), budget and sink. The loops only decide how the next logits are computed: one
``Engine.decode_one`` per token (plain) or one ``Engine.decode_batch`` row per live stream
(lockstep). Since a row's logits are bitwise the same either way (the engine is path
invariant), a stream produces the same tokens, events and finish in both loops.

Every failure of a stream (a grammar dead end, non-finite logits, an engine error in its
prefill) closes that stream's sink with an Error and ends that stream only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from inference.engine.engine import PREFILL_CHUNK, Engine
from inference.engine.families import Family
from inference.engine.kv_cache import KVCache
from inference.engine.logprobs import token_distribution
from inference.engine.sampler import NonFiniteLogits, Sampler, SamplingParams
from inference.generation.constraints import (
    ConstraintCompiler,
    ConstraintDeadEnd,
    ConstraintSpec,
    TokenConstraint,
)
from inference.generation.emitter import ReplyEmitter
from inference.types import (
    Error,
    Event,
    Finish,
    GenerationRequest,
    PreparedPrompt,
    Sink,
    TextDelta,
    TokenLogprob,
    Usage,
)

logger = logging.getLogger("lmserve.backend")


@dataclass
class GenerationStats:
    """Token counts and wall time of the two phases of one generation."""

    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens reused from the cache (not prefilled)
    prefill_seconds: float = 0.0
    generated_tokens: int = 0
    decode_forwards: int = 0
    decode_seconds: float = 0.0
    decoded_tokens: int = 0  # generated tokens written to the cache (one forward each, plain)
    spec_drafted: int = 0  # speculation: drafted tokens verified, and how many were accepted
    spec_accepted: int = 0

    @property
    def prefilled_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


def dead_end_error(request: GenerationRequest, generated: int, exc: ConstraintDeadEnd) -> Error:
    """The answer when the request's grammar let no token through: a 400 naming its field."""
    param = request.constraint.param if request.constraint is not None else None
    return Error(
        400,
        f"invalid '{param}': the constraint allows no next token after {generated} generated tokens, "
        f"so the reply cannot go on ({exc})",
        code="constraint_dead_end",
        param=param,
    )


def non_finite_error(generated: int, exc: NonFiniteLogits) -> Error:
    """The answer when the model computed NaN or infinite logits: the model is at fault."""
    return Error(
        500,
        f"generation failed after {generated} tokens: {exc}; the model file's weights (or their "
        "computation) are broken",
        code="non_finite_logits",
    )


@dataclass(frozen=True)
class BatchItem:
    """One request of a lockstep batch: what ``ConversationBackend.generate`` takes."""

    request: GenerationRequest
    prompt: PreparedPrompt
    sink: Sink


class Recorder:
    """A sink that keeps what a stream sends: its events, then its ``final`` (Finish or Error;
    None while open, and for good once cancelled). ``on_text`` sees each reply text as it
    comes; ``stop_when`` is asked after each token whether to cancel (the caller stopped
    reading)."""

    def __init__(
        self,
        on_text: Callable[[str], None] | None = None,
        stop_when: Callable[[], bool] | None = None,
    ):
        self.events: list[Event] = []
        self.final: Finish | Error | None = None
        self._on_text = on_text
        self._stop_when = stop_when

    @property
    def cancelled(self) -> bool:
        return self._stop_when is not None and self._stop_when()

    def push(self, event: Event) -> None:
        self.events.append(event)
        if self._on_text is not None and isinstance(event, TextDelta):
            self._on_text(event.text)

    def close(self, final: Finish | Error) -> None:
        self.final = final

    def prefix_chosen(self, documents: tuple[str, ...]) -> None:
        pass


class StreamCaches(Protocol):
    """The part of a backend's cache policy a stream calls on a failure."""

    def discard(self, cache: KVCache) -> None: ...


class StreamHost(Protocol):
    """What a stream reads from the backend that opens it (ConversationBackend): typed here so
    that this module, which the backend imports, imports no backend."""

    engine: Engine
    family: Family
    defaults: SamplingParams
    constraints: ConstraintCompiler
    caches: StreamCaches

    def constraint_spec(self, request: GenerationRequest) -> ConstraintSpec | None: ...


class DecodeStream:
    """One request being generated: :meth:`begin` prefills and takes the first token, then
    each :meth:`advance` takes the logits after :attr:`token` and picks the next one, until
    the stream is no longer :attr:`live` (its sink is then closed, or it was cancelled)."""

    def __init__(
        self,
        backend: StreamHost,
        request: GenerationRequest,
        prompt: PreparedPrompt,
        sink: Sink,
        cache: KVCache,
    ):
        self.backend = backend
        self.engine = backend.engine
        self.request = request
        self.prompt = prompt
        self.sink = sink
        self.cache = cache
        self.stats = GenerationStats(prompt_tokens=len(prompt.tokens))
        family = backend.family
        self.emitter = ReplyEmitter(
            request.stop,
            reasoning=request.reasoning,
            tools=family.tools if request.tools else None,
            tool_names=frozenset(tool.name for tool in request.tools),
            # A constrained reply is the grammar's from token 0, a prefilled one starts with the
            # client's text, and a raw prompt's is the model's text as written: no think head.
            think=family.think
            if request.constraint is None and not request.prefill and request.raw is None
            else None,
        )
        # Control tokens the think markers are made of: rendered while the think head is open.
        think = family.think
        markers = (self.engine.tokenizer.token_id(text) for text in (think.special if think else ()))
        self._marker_ids = frozenset(i for i in markers if i is not None)
        self.sampler = Sampler(request.sampling.resolve(backend.defaults))
        self.history = list(prompt.tokens)
        self.constraint: TokenConstraint | None = None
        self.token: int | None = None  # the token the next forward appends, while live
        self._decode_started = 0.0

    @property
    def live(self) -> bool:
        """Whether the stream wants another forward (with :attr:`token` appended)."""
        return self.token is not None

    @property
    def generated(self) -> int:
        return self.stats.generated_tokens

    # -- the two steps the loops drive ----------------------------------------------------
    def begin(self) -> None:
        """Compile the grammar, prefill the prompt's uncached rows and take the first token."""
        try:
            spec = self.backend.constraint_spec(self.request)
            if spec is not None:
                self.constraint = self.backend.constraints.constraint(spec)
            logits = self._prefill()
            if logits is None:
                return  # cancelled during the prefill: nothing more is pushed
            self._decode_started = time.perf_counter()
            self._take(logits)
        except Exception as exc:
            self.fail(exc)

    def advance(self, logits: np.ndarray, rows: int | None = None, forward: bool = True) -> None:
        """The forward appended :attr:`token`; ``logits`` (vocab,) follow it. ``rows``: the
        cache rows (prefix included) that count once :attr:`token` is committed (a speculative
        verify has appended drafted rows past them, which do not count against the context);
        default every row of the cache. ``forward``: these logits are a forward's first row
        (false for a verify's later rows, which that forward already counted)."""
        self.stats.decode_forwards += forward
        self.stats.decoded_tokens += 1
        self.stats.decode_seconds = time.perf_counter() - self._decode_started
        self.token = None
        try:
            self._take(logits, rows)
        except Exception as exc:
            self.fail(exc)

    def fail(self, exc: Exception) -> None:
        """End the stream with the Error ``exc`` stands for (the forward or a step raised)."""
        self.token = None
        generated = self.stats.generated_tokens
        if isinstance(exc, ConstraintDeadEnd):  # the cache is sound: the slot stays warm
            self.sink.close(dead_end_error(self.request, generated, exc))
            return
        self.backend.caches.discard(self.cache)  # the cache's rows are undefined now
        if isinstance(exc, NonFiniteLogits):
            logger.error("generation failed: %s", exc)
            self.sink.close(non_finite_error(generated, exc))
        else:  # an engine failure ends this request, not the server
            logger.error("generation failed", exc_info=exc)
            message = f"generation failed: {type(exc).__name__}: {exc}"
            self.sink.close(Error(500, message, code="internal_error"))

    # -- inside the steps -----------------------------------------------------------------
    def _prefill(self) -> np.ndarray | None:
        """Prefill the prompt's uncached rows chunk by chunk, checking between chunks whether
        the client left: a long prefill stops within one chunk of a hang-up, and the rows it
        did are kept in the slot, so a retry resumes from them. Returns the logits after the
        prompt, or None when cancelled."""
        t0 = time.perf_counter()
        prompt, engine = self.prompt.tokens, self.engine
        cached = engine.reuse_prefix(self.cache, prompt)
        for start in range(cached, len(prompt), PREFILL_CHUNK):
            if self.sink.cancelled:
                return None
            engine.prefill(self.cache, prompt[start : start + PREFILL_CHUNK])
        self.stats.cached_tokens = cached
        self.stats.prefill_seconds = time.perf_counter() - t0
        # Either the chunks just ran or reuse_prefix kept the whole prompt with its logits.
        return self.cache.prefill_logits[1]

    def _take(self, logits: np.ndarray, rows: int | None = None) -> None:
        """Pick the token after ``logits``, stream its text, and either set :attr:`token`
        for the next forward or finish the stream."""
        stats, constraint = self.stats, self.constraint
        if stats.generated_tokens >= self.prompt.max_tokens:
            return self._finish()
        allowed = constraint.allowed(logits.shape[0]) if constraint is not None else None
        scores = self.sampler.scores(logits, self.history, allowed)
        token = self.sampler.choose(scores)
        if token in self.engine.stop_ids and not self.request.ignore_eos:
            return self._finish()
        stats.generated_tokens += 1
        self.history.append(token)
        completed = constraint is not None and constraint.accept(token)
        in_head_marker = token in self._marker_ids and self.emitter.in_think_head
        text = (
            self.engine.tokenizer.token_bytes(token, special=True)
            if in_head_marker
            else self.engine.reply_bytes(token)
        )
        logprob = self._logprob(scores, token, text) if self.request.logprobs is not None else None
        for event in self.emitter.feed(text, logprob):
            self.sink.push(event)
        if self.emitter.stopped or completed or stats.generated_tokens >= self.prompt.max_tokens:
            return self._finish()
        rows = self.cache.n_positions if rows is None else rows
        if rows >= self.cache.n_ctx or self.sink.cancelled:
            return self._finish()
        self.token = token

    def _logprob(self, scores: np.ndarray, token: int, data: bytes) -> TokenLogprob:
        """The sampled token's log probability and the alternatives asked for, from the very
        scores it was chosen from (``data``: the bytes it adds to the reply)."""
        dist = token_distribution(scores, token, self.request.logprobs.top, self.sampler.params.temperature)
        token_bytes = self.engine.tokenizer.token_bytes
        top = tuple(TokenLogprob(token_bytes(t.id, special=True), t.logprob) for t in dist.top)
        return TokenLogprob(data, dist.chosen.logprob, top)

    def _finish(self) -> None:
        """Close the sink with the finish reason (nothing is pushed once cancelled)."""
        if self.sink.cancelled:
            return
        for event in self.emitter.flush():
            self.sink.push(event)
        emitter, stats = self.emitter, self.stats
        if emitter.stopped or (self.constraint is not None and self.constraint.completed):
            reason = "stop"
        else:
            reason = "length" if stats.generated_tokens >= self.prompt.max_tokens else "stop"
        if reason == "stop" and emitter.calls:
            reason = "tool_calls"  # a reply that made calls finishes so, even if a stop string ended it
        usage = Usage(
            stats.prompt_tokens, stats.generated_tokens, stats.cached_tokens, emitter.reasoning_tokens
        )
        stop_sequence = emitter.stopped_by if reason == "stop" else None
        self.sink.close(Finish(reason, usage, stop_sequence))
