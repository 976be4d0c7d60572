"""The cache policy of recurrent families (Qwen3.5's gated DeltaNet): every request on a fresh cache.

A DeltaNet layer's conv inputs and state matrices summarise every token seen so far and cannot
be cut back to a shorter prefix, so no request may start from an earlier one's rows: there is
no slot pool, no disk tier, no KV prefix, no speculation (a verify run would have to be cut
back) and no lockstep batch (``StateKind.RECURRENT``: the flags for them are refused at
start-up). The conversation backend serves the family with :class:`FreshCaches`: each request
gets an empty :class:`~inference.engine.models.deltanet.HybridCache` sized for its prompt and
budget, prefilled from token 0 (``cached_tokens`` is always 0), and dropped afterwards.

Qwen3.5/3.6 templates prefill the think opener in the generation prompt (``Family.think_prefilled``):
the backend feeds the opener to the reply's think router before the first token, and a
constrained or prefilled reply renders thinking off (``ConversationBackend.thinking``).
"""

from __future__ import annotations

from inference.engine.engine import Engine
from inference.engine.kv_cache import KVCache
from inference.generation.backend import ConversationBackend
from inference.kv.prefix_source import PrefixChoice
from inference.types import PreparedPrompt


class FreshCaches:
    """A new cache per request, sized for its prompt and budget; nothing kept after it."""

    slots = None  # no warm rows: nothing to list, evict or reuse

    def __init__(self, engine: Engine, n_ctx: int):
        self.engine = engine
        self.n_ctx = n_ctx

    def acquire(self, prompt: PreparedPrompt, choice: PrefixChoice | None) -> KVCache:
        if choice is not None:  # refused at start-up; a cache that rolls forward has no prefix rows
            raise ValueError("a fresh recurrent cache cannot run behind a KV prefix")
        return self.engine.new_cache(min(self.n_ctx, len(prompt.tokens) + prompt.max_tokens + 1))

    def release(self) -> None:
        """Nothing to give back: each request's cache is dropped with its stream."""

    def finish(self, cache: KVCache) -> None:
        """Nothing to give back: the stream's cache is dropped with it."""

    def scratch(self, tokens: list[int]) -> KVCache:
        return self.engine.new_cache(len(tokens) + 3)

    def discard(self, cache: KVCache) -> None:
        """Nothing to forget: the cache is dropped."""


def recurrent_backend(engine: Engine, n_ctx: int) -> ConversationBackend:
    """The conversation backend over fresh caches (``backends.BACKENDS["recurrent"]``)."""
    return ConversationBackend(engine, n_ctx, caches=FreshCaches(engine, n_ctx))
