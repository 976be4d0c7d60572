"""Resident KV caches (``--kv-slots``) that later requests warm-start from.

The API is stateless but the cache need not be: a follow-up turn repeats the whole previous
conversation, so the slot that served it already holds all but the newest tokens. Each
request adopts the slot sharing the longest token prefix with its prompt, if the share is
worth it (at least 10% of the prompt, llama.cpp's similarity gate); otherwise the least
recently used slot. A request that only shares a prefix with a slot (same system prompt,
different dialogue) copies those rows into another slot, leaving the donor intact for its own
continuation. A request continues a slot when it repeats the slot's whole previous prompt (its
divergence, if any, lies in the reply the slot generated, which the client may re-tokenize).

A request may run behind a KV prefix (a cartridge, a fleet's composition: PrefixChoice). A slot
remembers the key of the prefix its rows follow and shares them only with a request of the same
key; a slot taken under another key gets the request's prefix installed (its old tokens gone).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from inference.engine.kv_cache import KVCache
from inference.kv.disk import SidecarStore, StoredSlot
from inference.kv.prefix_source import PrefixChoice

logger = logging.getLogger("lmserve.slots")

SIMILARITY_GATE = 0.1  # a slot is worth adopting when it covers this share of the prompt

_ticks = itertools.count()


@dataclass
class SlotStats:
    """How slot choices went since start (read by GET /metrics)."""

    resident_hits: int = 0  # started from a resident slot's rows
    disk_hits: int = 0  # started from a sidecar file restored into a slot
    misses: int = 0  # no reusable prefix: prefilled from scratch
    disk_spills: int = 0  # slots written to the disk tier before being reused


@dataclass(eq=False)
class Slot:
    """One resident cache and when it was last used."""

    index: int
    cache: KVCache | None = None  # allocated on first use
    last_used: int = field(default_factory=lambda: next(_ticks))
    prompt_len: int = 0  # the prompt of the request this slot last served
    used_at: float = 0.0  # wall-clock time of the last use, for the admin
    busy: bool = False  # a generation is writing into it
    evict_pending: bool = False  # the admin asked to evict it while it was busy

    @property
    def tokens(self) -> list[int]:
        return self.cache.tokens if self.cache is not None else []

    @property
    def prefix_key(self) -> str:
        """The key of the prefix this slot's rows follow ("" for none)."""
        return self.cache.prefix_key if self.cache is not None else ""

    def shared(self, prompt: list[int], key: str) -> int:
        """The tokens of ``prompt`` this slot holds behind the prefix ``key`` (0 under another)."""
        if self.cache is None or self.cache.prefix_key != key:
            return 0
        return self.cache.common_prefix(prompt)


def choice_key(choice: PrefixChoice | None) -> str:
    return "" if choice is None else choice.key


class SlotPool:
    """``n_slots`` caches of ``n_ctx`` positions each. Used only by the worker thread."""

    def __init__(self, new_cache: Callable[[], KVCache], n_slots: int, disk: SidecarStore | None = None):
        if n_slots < 1:
            raise ValueError(f"need at least one KV slot, got {n_slots}")
        self._new_cache = new_cache
        self.slots = [Slot(i) for i in range(n_slots)]
        self.disk = disk
        self.stats = SlotStats()
        # The worker thread owns the caches; the admin inspects and evicts from other threads.
        self.lock = threading.Lock()

    def acquire(self, prompt: list[int], choice: PrefixChoice | None = None) -> KVCache:
        """The cache to generate ``prompt`` in, behind ``choice``'s prefix (None: no prefix);
        its rows past the shared tokens are stale and will be overwritten (a stream's
        prefill keeps only the common prefix)."""
        with self.lock:
            chosen = self.choose(prompt, choice)
            chosen.last_used = next(_ticks)
            chosen.used_at = time.time()
            chosen.prompt_len = len(prompt)
            chosen.busy = True
            cache = self._ensure_cache(chosen)
            if cache.prefix_key != choice_key(choice):
                cache.install_prefix(None if choice is None else choice.prefix, choice_key(choice))
            return cache

    def release(self) -> None:
        """The generation ended: slots may be evicted now (and pending evictions happen)."""
        with self.lock:
            for slot in self.slots:
                self._free(slot)

    def release_cache(self, cache: KVCache) -> None:
        """One stream of a lockstep batch ended: the slot holding ``cache`` may serve a stream
        that joins the batch (its rows stay, as every slot's do)."""
        with self.lock:
            for slot in self.slots:
                if slot.cache is cache:
                    self._free(slot)

    def _free(self, slot: Slot) -> None:
        """No generation writes ``slot`` now: an eviction the admin asked for happens."""
        slot.busy = False
        if slot.evict_pending:
            self._evict(slot)

    def evict(self, index: int) -> str:
        """Free one slot's cache ("evicted"), or mark it for after its generation ("pending")."""
        with self.lock:
            slot = self.slots[index]
            if slot.busy:
                slot.evict_pending = True
                return "pending"
            self._evict(slot)
            return "evicted"

    def _evict(self, slot: Slot) -> None:
        slot.cache, slot.prompt_len, slot.evict_pending = None, 0, False

    def status(self) -> list[dict]:
        """Each slot's tokens, last use and memory, as plain data."""
        with self.lock:
            return [
                {
                    "index": s.index,
                    "tokens": len(s.tokens),
                    "prefix_key": s.prefix_key,
                    "prefix_rows": s.cache.prefix_rows if s.cache is not None else 0,
                    "last_used": s.used_at or None,
                    "bytes": s.cache.nbytes if s.cache is not None else 0,
                    "busy": s.busy,
                    "evict_pending": s.evict_pending,
                }
                for s in self.slots
            ]

    def delete_sidecar(self, name: str) -> bool:
        """Remove one sidecar file of the disk tier; False when it is not one of its files."""
        with self.lock:
            return self.disk is not None and self.disk.delete(self.disk.directory / name)

    def choose(self, prompt: list[int], choice: PrefixChoice | None = None) -> Slot:
        """The slot ``prompt`` will be generated in, with any shared tokens copied into it.
        Slots busy with another stream of a lockstep batch may lend their rows but are never
        chosen: each stream writes its own cache."""
        if not any(not s.busy for s in self.slots):
            raise RuntimeError(f"every KV slot is busy ({len(self.slots)}): a batch needs one per stream")
        key = choice_key(choice)
        best, shared = self.best_match(prompt, key)
        restored = self._restore(prompt, shared, key)
        if restored is not None:
            self.stats.disk_hits += 1
            return restored
        if best is None or shared < SIMILARITY_GATE * len(prompt):
            self.stats.misses += 1
            return self._take(self.least_recent(), prompt, key)
        self.stats.resident_hits += 1
        free = [s for s in self.slots if not s.busy]
        if not best.busy and (shared >= best.prompt_len or free == [best]):
            return self._take(best, prompt, key)  # a continuation (or nowhere else to go): adopt it whole
        # A shared prefix only: copy it elsewhere and keep the donor for its own follow-up.
        target = self._take(self.least_recent(exclude=best), prompt, key)
        self._ensure_cache(target).copy_rows_from(best.cache, shared)
        return target

    def _take(self, slot: Slot, prompt: list[int], key: str, restoring: StoredSlot | None = None) -> Slot:
        """``slot``, its contents spilled to disk first when ``prompt`` (behind the prefix
        ``key``) keeps under half of them (never evicting ``restoring``, the file about to be
        loaded into it)."""
        cache = slot.cache
        if self.disk is None or cache is None or not cache.tokens:
            return slot
        if slot.shared(prompt, key) * 2 < cache.n_tokens:
            try:
                self.disk.spill(cache, keep=restoring)
                self.stats.disk_spills += 1
            except OSError:  # a full or read-only disk costs the warm start, not the request
                logger.exception("could not spill a KV slot to %s", self.disk.directory)
        return slot

    def _restore(self, prompt: list[int], resident_shared: int, key: str) -> Slot | None:
        """A slot loaded from the sidecar that beats every resident slot, if one does."""
        if self.disk is None:
            return None
        stored, shared = self.disk.best_match(prompt, key)
        if stored is None or shared <= resident_shared or shared < SIMILARITY_GATE * len(prompt):
            return None
        target = self._take(self.least_recent(), prompt, key, restoring=stored)
        return target if self.disk.restore(stored, self._ensure_cache(target)) else None

    def least_recent(self, exclude: Slot | None = None) -> Slot:
        """The free slot used longest ago (other than ``exclude``)."""
        return min((s for s in self.slots if s is not exclude and not s.busy), key=lambda s: s.last_used)

    def reset(self, cache: KVCache) -> None:
        """Forget a cache's tokens (after a failed generation left them undefined); its prefix
        rows, written before the generation, stay."""
        cache.truncate(0)

    def best_match(self, prompt: list[int], key: str = "") -> tuple[Slot | None, int]:
        """The resident slot behind the prefix ``key`` sharing the longest token prefix with
        ``prompt``, and that length."""
        best, shared = None, 0
        for slot in self.slots:
            n = slot.shared(prompt, key)
            if n > shared:
                best, shared = slot, n
        return best, shared

    def _ensure_cache(self, slot: Slot) -> KVCache:
        if slot.cache is None:
            slot.cache = self._new_cache()
        return slot.cache
