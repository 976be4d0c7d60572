"""The conversation backend: how one loaded model serves a GenerationRequest.

Two halves, as every backend has: ``validate`` runs on the connection side before a job is
queued (render the chat template, tokenize, check the context: cheap, and a failure here is a
plain 400 before any model work), and ``generate`` runs on the worker thread (pick a warm KV
slot, prefill, decode, stream text through the emitter into the request's sink).
"""

from __future__ import annotations

import logging
from typing import Protocol

from inference.engine.engine import Engine, GenerationStats
from inference.engine.kv_cache import KVCache

from .emitter import TextEmitter
from .slots import SlotPool
from .types import Error, Finish, GenerationRequest, Message, PreparedPrompt, TextDelta, Usage

DEFAULT_MAX_TOKENS = 1024
logger = logging.getLogger("lmserve.backend")


class Sink(Protocol):
    """Where the worker streams a request's events (a StreamPipe)."""

    @property
    def cancelled(self) -> bool: ...

    def push(self, event) -> None: ...

    def close(self, final: Finish | Error) -> None: ...


class ConversationBackend:
    """Chat-template prompting, slot reuse and plain per-token decoding over an Engine."""

    def __init__(self, engine: Engine, n_ctx: int, kv_slots: int = 1):
        self.engine = engine
        self.n_ctx = n_ctx
        self.defaults = engine.recommended_sampling()
        self.slots = SlotPool(lambda: engine.new_cache(n_ctx), kv_slots)

    # -- connection side -------------------------------------------------------------------
    @property
    def supports_reasoning(self) -> bool:
        """Whether a reasoning channel exists: the emitter would have to route the family's
        think block apart from the reply. No family's is routed yet, so none has one."""
        return False

    def tokenize(self, request: GenerationRequest) -> list[int] | Error:
        """The conversation rendered with the chat template and tokenized, whatever its length."""
        from inference.engine.chat_template import ChatTemplateError

        try:
            text = self.engine.render_chat(request.template_messages())
        except ChatTemplateError as exc:
            return Error(400, f"the model's chat template rejected the messages: {exc}", param="messages")
        return self.engine.encode_prompt(text)

    def validate(self, request: GenerationRequest) -> PreparedPrompt | Error:
        """Render and tokenize the conversation; reject it if it leaves no room to reply."""
        tokens = self.tokenize(request)
        if isinstance(tokens, Error):
            return tokens
        room = self.n_ctx - len(tokens)
        if room < 1:
            return Error(
                400,
                f"the prompt is {len(tokens)} tokens but the context (--ctx) holds {self.n_ctx}, "
                "leaving no room for a reply",
                code="context_length_exceeded",
                param="messages",
            )
        wanted = request.max_tokens if request.max_tokens is not None else DEFAULT_MAX_TOKENS
        return PreparedPrompt(tokens, min(wanted, room))

    # -- worker side -----------------------------------------------------------------------
    def generate(self, request: GenerationRequest, prompt: PreparedPrompt, sink: Sink) -> int:
        """Stream the reply into ``sink`` and close it with Finish (or Error on a failure).
        Returns the number of tokens generated. Stops at the next token once ``sink`` is
        cancelled, then pushes nothing more."""
        stats = GenerationStats()
        emitter = TextEmitter(request.stop)
        cache = self.slots.acquire(prompt.tokens)
        try:
            reason = self._decode(request, prompt, cache, stats, emitter, sink)
        except Exception as exc:  # an engine failure ends this request, not the server
            logger.exception("generation failed")
            self.slots.reset(cache)
            sink.close(Error(500, f"generation failed: {type(exc).__name__}: {exc}", code="internal_error"))
            return stats.generated_tokens
        if reason is not None:
            usage = Usage(stats.prompt_tokens, stats.generated_tokens, stats.cached_tokens)
            sink.close(Finish(reason, usage, emitter.stopped_by))
        return stats.generated_tokens

    def _decode(
        self,
        request: GenerationRequest,
        prompt: PreparedPrompt,
        cache: KVCache,
        stats: GenerationStats,
        emitter: TextEmitter,
        sink: Sink,
    ) -> str | None:
        """Run the decode loop; the finish reason, or None when the request was cancelled."""
        token_bytes = self.engine.tokenizer.token_bytes
        tokens = self.engine.generate(
            cache,
            prompt.tokens,
            request.sampling.resolve(self.defaults),
            prompt.max_tokens,
            ignore_eos=request.ignore_eos,
            stats=stats,
            should_stop=lambda: sink.cancelled,
        )
        for token in tokens:
            text = emitter.feed(token_bytes(token))
            if text:
                sink.push(TextDelta(text))
            if emitter.stopped:
                tokens.close()
                return None if sink.cancelled else "stop"
        if sink.cancelled:
            return None
        tail = emitter.flush()
        if tail:
            sink.push(TextDelta(tail))
        return "length" if stats.generated_tokens >= prompt.max_tokens else "stop"

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
