"""The conversation backend: how one loaded model serves a GenerationRequest.

Two halves, as every backend has: ``validate`` runs on the connection side before a job is
queued (render the chat template, tokenize, check the context: cheap, and a failure here is a
plain 400 before any model work), and ``generate`` runs on the worker thread (pick a warm KV
slot, prefill, decode, stream text through the emitter into the request's sink).

With a prefix source (``--cartridge``, a fleet), the worker side first asks it which KV prefix
the conversation runs behind (PrefixChoice); the prefix's rows take room in the context but are
never prompt tokens: usage and ``cached_tokens`` count the real tokens past them.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from inference.engine.engine import PREFILL_CHUNK, Engine, GenerationStats
from inference.engine.kv_cache import KVCache
from inference.engine.sampler import NonFiniteLogits
from inference.generation.constraints import (
    ConstraintCompiler,
    ConstraintDeadEnd,
    ConstraintSpec,
    TokenConstraint,
)
from inference.generation.emitter import ReplyEmitter
from inference.generation.toolcall import resolve_forced_call
from inference.kv.disk import SidecarStore
from inference.kv.prefix_source import PrefixChoice, PrefixSource
from inference.kv.slots import SlotPool
from inference.types import (
    ContextOverflow,
    Embeddings,
    Error,
    Finish,
    GenerationRequest,
    Message,
    PreparedPrompt,
    Usage,
)

DEFAULT_MAX_TOKENS = 1024
logger = logging.getLogger("lmserve.backend")


def openai_overflow_message(overflow: ContextOverflow) -> str:
    """OpenAI's wording of a context overflow, older and newer, so clients that match either
    (litellm, LangChain, the Agents SDK) recognise it; the Anthropic dialect words it its own way."""
    return (
        f"This model's maximum context length is {overflow.n_ctx} tokens. However, your messages "
        f"resulted in {overflow.prompt_tokens} tokens. Please reduce the length of the messages. "
        f"Input tokens exceed the configured limit of {overflow.n_ctx} tokens (this server's --ctx)."
    )


class Sink(Protocol):
    """Where the worker streams a request's events (a StreamPipe)."""

    @property
    def cancelled(self) -> bool: ...

    def push(self, event) -> None: ...

    def close(self, final: Finish | Error | Embeddings) -> None: ...

    def prefix_chosen(self, documents: tuple[str, ...]) -> None:
        """The prefix is chosen (before any event): the fleet documents it composes."""


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


class ConversationBackend:
    """Chat-template prompting, slot reuse and plain per-token decoding over an Engine: the
    generic backend (``backends.BACKENDS["conversation"]``), for every family whose cache can
    be cut back to a token prefix."""

    def __init__(
        self,
        engine: Engine,
        n_ctx: int,
        kv_slots: int = 1,
        disk: SidecarStore | None = None,
        prefix_source: PrefixSource | None = None,
    ):
        self.engine = engine
        self.prefix_source = prefix_source
        self.family = engine.family
        self.n_ctx = n_ctx
        self.defaults = engine.recommended_sampling()
        self.slots = SlotPool(lambda: engine.new_cache(n_ctx), kv_slots, disk)
        self.constraints = ConstraintCompiler(engine.tokenizer, stop_ids=engine.stop_ids)

    # -- connection side -------------------------------------------------------------------
    @property
    def supports_reasoning(self) -> bool:
        """Whether a reasoning channel exists: the family writes think blocks, which the
        emitter routes apart from the reply."""
        return self.family.think is not None

    @property
    def supports_tools(self) -> bool:
        """Whether the family has a tool-call convention the emitter captures (and the
        template renders declarations)."""
        return self.family.tools is not None and self.engine.chat_template.supports_tools

    @property
    def kv_reuse(self) -> bool:
        """Whether a request may start from the cached rows of an earlier one."""
        return self.family.kv_reuse

    def release(self) -> None:
        """After a job: the slot it used goes back to the pool (its rows stay warm)."""
        self.slots.release()

    def constraint_spec(self, request: GenerationRequest) -> ConstraintSpec | None:
        """The request's constraint, a forced call spelled in this family's call convention."""
        spec = request.constraint
        return None if spec is None else resolve_forced_call(spec, self.family.tools)

    def tokenize(self, request: GenerationRequest) -> list[int] | Error:
        """The conversation rendered with the chat template and tokenized, whatever its length."""
        from inference.engine.chat_template import ChatTemplateError

        try:
            tools = [tool.template_dict() for tool in request.tools] or None
            # A prefill continues the assistant turn the generation prompt opened (rendering it
            # as a message would close that turn and open another).
            return self.engine.encode_chat(
                request.template_messages(),
                tools=tools,
                continuation=request.prefill,
                enable_thinking=request.reasoning,
            )
        except ChatTemplateError as exc:
            return Error(400, f"the model's chat template rejected the messages: {exc}", param="messages")

    def validate(self, request: GenerationRequest) -> PreparedPrompt | Error:
        """Check the constraint, render and tokenize the conversation; reject it if it leaves
        no room to reply."""
        spec = self.constraint_spec(request)
        if spec is not None:
            problem = self.constraints.validate(spec)
            if problem is not None:
                param = request.constraint.param
                return Error(400, f"invalid '{param}': {problem}", code="invalid_value", param=param)
        tokens = self.tokenize(request)
        if isinstance(tokens, Error):
            return tokens
        room = self.n_ctx - len(tokens)
        if room < 1:
            overflow = ContextOverflow(len(tokens), self.n_ctx)
            message = openai_overflow_message(overflow)
            return Error(400, message, code="context_length_exceeded", param="messages", overflow=overflow)
        wanted = request.max_tokens if request.max_tokens is not None else DEFAULT_MAX_TOKENS
        return PreparedPrompt(tokens, min(wanted, room))

    # -- worker side -----------------------------------------------------------------------
    def _choose_prefix(
        self, request: GenerationRequest, prompt: PreparedPrompt, sink: Sink
    ) -> tuple[PrefixChoice | None, PreparedPrompt] | Error:
        """The prefix the request runs behind (None without a source) and its prompt with the
        reply budget cut to the room the prefix leaves; an Error when it leaves none."""
        if self.prefix_source is None:
            return None, prompt
        try:
            choice = self.prefix_source.choose(self.engine, request)
        except Exception as exc:  # a broken source fails this request, not the server
            logger.exception("choosing the KV prefix failed")
            message = f"choosing the KV prefix failed: {type(exc).__name__}: {exc}"
            return Error(500, message, code="internal_error")
        sink.prefix_chosen(choice.documents)
        limit = self.n_ctx - choice.prefix.rows  # the context left for real tokens
        room = limit - len(prompt.tokens)
        if room < 1:
            overflow = ContextOverflow(len(prompt.tokens), max(limit, 0))
            message = openai_overflow_message(overflow)
            return Error(400, message, code="context_length_exceeded", param="messages", overflow=overflow)
        return choice, PreparedPrompt(prompt.tokens, min(prompt.max_tokens, room))

    def generate(self, request: GenerationRequest, prompt: PreparedPrompt, sink: Sink) -> int:
        """Stream the reply into ``sink`` and close it with Finish (or Error on a failure).
        Returns the number of tokens generated. Stops at the next token once ``sink`` is
        cancelled, then pushes nothing more."""
        stats = GenerationStats()
        emitter = ReplyEmitter(
            request.stop,
            reasoning=request.reasoning,
            tools=self.family.tools if request.tools else None,
            # A constrained reply is the grammar's from token 0, and a prefilled one starts with
            # the client's text: neither has a think head.
            think=self.family.think if request.constraint is None and not request.prefill else None,
        )
        chosen = self._choose_prefix(request, prompt, sink)
        if isinstance(chosen, Error):
            sink.close(chosen)
            return 0
        choice, prompt = chosen
        cache = self.slots.acquire(prompt.tokens, choice)
        if not self.kv_reuse:  # the family's state cannot be cut back to a prefix: start clean
            self.slots.reset(cache)
        try:
            reason = self._decode(request, prompt, cache, stats, emitter, sink)
        except ConstraintDeadEnd as exc:  # the cache is sound: the slot stays warm
            sink.close(dead_end_error(request, stats.generated_tokens, exc))
            return stats.generated_tokens
        except NonFiniteLogits as exc:
            logger.error("generation failed: %s", exc)
            self.slots.reset(cache)
            sink.close(non_finite_error(stats.generated_tokens, exc))
            return stats.generated_tokens
        except Exception as exc:  # an engine failure ends this request, not the server
            logger.exception("generation failed")
            self.slots.reset(cache)
            sink.close(Error(500, f"generation failed: {type(exc).__name__}: {exc}", code="internal_error"))
            return stats.generated_tokens
        if reason == "stop" and emitter.calls:
            reason = "tool_calls"
        if reason is not None:
            usage = Usage(
                stats.prompt_tokens, stats.generated_tokens, stats.cached_tokens, emitter.reasoning_tokens
            )
            # A reply that made calls finishes as tool_calls, even if a stop string ended it.
            stop_sequence = emitter.stopped_by if reason == "stop" else None
            sink.close(Finish(reason, usage, stop_sequence))
        return stats.generated_tokens

    def _decode(
        self,
        request: GenerationRequest,
        prompt: PreparedPrompt,
        cache: KVCache,
        stats: GenerationStats,
        emitter: ReplyEmitter,
        sink: Sink,
    ) -> str | None:
        """Run the decode loop; the finish reason, or None when the request was cancelled."""
        token_bytes = self.engine.tokenizer.token_bytes
        constraint: TokenConstraint | None = None
        spec = self.constraint_spec(request)
        if spec is not None:
            constraint = self.constraints.constraint(spec)
        t0 = time.perf_counter()
        cached = self._prefill(cache, prompt.tokens, sink)
        if cached is None:
            return None
        prefill_seconds = time.perf_counter() - t0
        tokens = self.engine.generate(
            cache,
            prompt.tokens,
            request.sampling.resolve(self.defaults),
            prompt.max_tokens,
            ignore_eos=request.ignore_eos,
            stats=stats,
            should_stop=lambda: sink.cancelled,
            constraint=constraint,
        )
        for token in tokens:
            for event in emitter.feed(token_bytes(token)):
                sink.push(event)
            if emitter.stopped:
                tokens.close()
                break
        # The engine found the whole prompt in the cache: _prefill put it there.
        stats.cached_tokens, stats.prefill_seconds = cached, prefill_seconds + stats.prefill_seconds
        if sink.cancelled:
            return None
        for event in emitter.flush():
            sink.push(event)
        if emitter.stopped:
            return "stop"
        if constraint is not None and constraint.completed:
            return "stop"
        return "length" if stats.generated_tokens >= prompt.max_tokens else "stop"

    def _prefill(self, cache: KVCache, prompt: list[int], sink: Sink) -> int | None:
        """Prefill the prompt's uncached rows chunk by chunk, checking between chunks whether
        the client left: a long prefill stops within one chunk of a hang-up, and the rows it
        did are kept in the slot, so a retry resumes from them. Returns how many prompt tokens
        were cached before, or None when cancelled."""
        cached = self.engine.reuse_prefix(cache, prompt)
        for start in range(cached, len(prompt), PREFILL_CHUNK):
            if sink.cancelled:
                return None
            self.engine.prefill(cache, prompt[start : start + PREFILL_CHUNK])
        return cached

    def warm_up(self) -> None:
        """Run one tiny generation so the first request does not pay for JIT compilation;
        the slot it used is cleared again."""
        request = GenerationRequest(messages=(Message("user", "Hi"),), max_tokens=2)
        prepared = self.validate(request)
        if isinstance(prepared, Error):
            raise RuntimeError(f"warm-up prompt rejected: {prepared.message}")
        cache = self.slots.acquire(prepared.tokens)
        for _ in self.engine.generate(cache, prepared.tokens, self.defaults, 2):
            pass
        self.slots.reset(cache)
