"""The backend of recurrent families (Qwen3.5's gated DeltaNet): every request on a fresh cache.

A DeltaNet layer's conv inputs and state matrices summarise every token seen so far and cannot
be cut back to a shorter prefix, so no request may start from an earlier one's rows: there is
no slot pool, no disk tier, no KV prefix, no speculation (a verify run would have to be cut
back) and no lockstep batch (the worker serves batched jobs one after another). Each request
gets an empty :class:`~inference.engine.models.deltanet.HybridCache` sized for its prompt and
budget, prefilled from token 0 (``cached_tokens`` is always 0), and dropped afterwards.

Qwen3.5/3.6 templates prefill the think opener in the generation prompt (``Family.think_prefilled``):
the reply starts inside the think block, so its opener is fed to the reply's think router
before the first token, and the rest routes as any think block does. A constrained or
prefilled reply renders thinking off (the template's empty think block), so the grammar or the
client's text governs the reply from its first token.
"""

from __future__ import annotations

from inference.engine.engine import Engine
from inference.generation.backend import ConversationBackend, Sink
from inference.generation.prompts import raw_prompt_tokens
from inference.generation.stream import DecodeStream
from inference.types import Error, GenerationRequest, Message, PreparedPrompt


class RecurrentBackend(ConversationBackend):
    """Chat-template prompting and per-token decoding like the conversation backend, on a new
    cache per request (``backends.BACKENDS["recurrent"]``)."""

    # No lockstep loop (capabilities.batch is false): the worker serves jobs one at a time.
    generate_batch = None

    def __init__(self, engine: Engine, n_ctx: int):
        super().__init__(engine, n_ctx, kv_slots=1)
        self.slots = None  # no warm rows: nothing to list, evict or reuse

    def release(self) -> None:
        """Nothing to give back: each request's cache is dropped with its stream (its numbers
        join the totals)."""
        self.count_opened()

    def thinking(self, request: GenerationRequest) -> bool:
        """Whether the prompt opens the think block: reasoning asked for, and neither a grammar
        nor a client prefill governs the reply from its first token."""
        return request.reasoning and request.constraint is None and not request.prefill

    def tokenize(self, request: GenerationRequest) -> list[int] | Error:
        from inference.engine.chat_template import ChatTemplateError

        if request.raw is not None:
            return raw_prompt_tokens(self.engine, request.raw, self.n_ctx, request.max_tokens)
        try:
            tools = [tool.template_dict() for tool in request.tools] or None
            return self.engine.encode_chat(
                request.template_messages(),
                tools=tools,
                continuation=request.prefill,
                enable_thinking=self.thinking(request),
            )
        except ChatTemplateError as exc:
            return Error(400, f"the model's chat template rejected the messages: {exc}", param="messages")

    def open_stream(self, request: GenerationRequest, prompt: PreparedPrompt, sink: Sink) -> DecodeStream:
        """The request's decoding state on a fresh cache, prefilled, its first token taken."""
        capacity = min(self.n_ctx, len(prompt.tokens) + prompt.max_tokens + 1)
        stream = DecodeStream(self, request, prompt, sink, self.engine.new_cache(capacity))
        self._opened.append(stream)
        router = stream.emitter.router
        if self.family.think_prefilled and self.thinking(request) and router is not None:
            router.feed(self.family.think.open)  # the block the prompt opened
        stream.begin()
        return stream

    def warm_up(self) -> None:
        """One tiny generation so the first request does not pay for JIT compilation."""
        request = GenerationRequest(messages=(Message("user", "Hi"),), max_tokens=2)
        prepared = self.validate(request)
        if isinstance(prepared, Error):
            raise RuntimeError(f"warm-up prompt rejected: {prepared.message}")
        cache = self.engine.new_cache(len(prepared.tokens) + 3)
        for _ in self.engine.generate(cache, prepared.tokens, self.defaults, 2):
            pass
