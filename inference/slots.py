"""Resident KV caches (``--kv-slots``) that later requests warm-start from.

The API is stateless but the cache need not be: a follow-up turn repeats the whole previous
conversation, so the slot that served it already holds all but the newest tokens. Each
request adopts the slot sharing the longest token prefix with its prompt, if the share is
worth it (at least 10% of the prompt, llama.cpp's similarity gate); otherwise the least
recently used slot. A request that only shares a prefix with a slot (same system prompt,
different dialogue) copies those rows into another slot, leaving the donor intact for its own
continuation.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from inference.engine.kv_cache import KVCache

SIMILARITY_GATE = 0.1  # a slot is worth adopting when it covers this share of the prompt

_ticks = itertools.count()


@dataclass(eq=False)
class Slot:
    """One resident cache and when it was last used."""

    index: int
    cache: KVCache | None = None  # allocated on first use
    last_used: int = field(default_factory=lambda: next(_ticks))

    @property
    def tokens(self) -> list[int]:
        return self.cache.tokens if self.cache is not None else []


class SlotPool:
    """``n_slots`` caches of ``n_ctx`` positions each. Used only by the worker thread."""

    def __init__(self, new_cache: Callable[[], KVCache], n_slots: int):
        if n_slots < 1:
            raise ValueError(f"need at least one KV slot, got {n_slots}")
        self._new_cache = new_cache
        self.slots = [Slot(i) for i in range(n_slots)]

    def acquire(self, prompt: list[int]) -> KVCache:
        """The cache to generate ``prompt`` in; its rows past the shared prefix are stale and
        will be overwritten (Engine.generate keeps only the common prefix)."""
        best, shared = self._best_match(prompt)
        lru = min(self.slots, key=lambda s: s.last_used)
        if best is None or shared < SIMILARITY_GATE * len(prompt):
            chosen = lru
        elif shared >= len(best.tokens) or best is lru or len(self.slots) == 1:
            chosen = best  # a continuation (or nowhere else to go): adopt the whole slot
        else:
            chosen = lru  # a shared prefix only: copy it, keep the donor for its own follow-up
            self._ensure_cache(chosen).copy_rows_from(best.cache, shared)
        chosen.last_used = next(_ticks)
        return self._ensure_cache(chosen)

    def reset(self, cache: KVCache) -> None:
        """Forget a cache's contents (after a failed generation left them undefined)."""
        cache.truncate(0)

    def _best_match(self, prompt: list[int]) -> tuple[Slot | None, int]:
        best, shared = None, 0
        for slot in self.slots:
            if slot.cache is None:
                continue
            n = slot.cache.common_prefix(prompt)
            if n > shared:
                best, shared = slot, n
        return best, shared

    def _ensure_cache(self, slot: Slot) -> KVCache:
        if slot.cache is None:
            slot.cache = self._new_cache()
        return slot.cache
