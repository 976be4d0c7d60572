"""Per-conversation key/value cache.

Rows are positions: row ``i`` holds the keys and values of the token at position ``i``
(keys already normed and rotated), stored as float16 like llama.cpp's default cache: half
the memory of float32 and no loss, since every value is rounded to f16 anyway. ``tokens``
shadows the rows so a later request can find the longest common prefix with what is cached
and prefill only the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class KVGeometry:
    """What one cache row looks like; two caches can share rows only if these agree."""

    n_layers: int
    n_kv_heads: int
    head_dim_k: int
    head_dim_v: int

    def bytes_per_position(self, itemsize: int = 2) -> int:
        return self.n_layers * self.n_kv_heads * (self.head_dim_k + self.head_dim_v) * itemsize


class ContextFullError(ValueError):
    """A write would go past the cache's context length."""


class KVCache:
    """Keys and values for every layer, position-major within each kv head."""

    def __init__(self, geometry: KVGeometry, n_ctx: int):
        g = geometry
        self.geometry = g
        self.n_ctx = n_ctx
        self.k = np.zeros((g.n_layers, g.n_kv_heads, n_ctx, g.head_dim_k), np.float16)  # (L, kvh, ctx, hd)
        self.v = np.zeros((g.n_layers, g.n_kv_heads, n_ctx, g.head_dim_v), np.float16)  # (L, kvh, ctx, hd)
        self.tokens: list[int] = []
        # The logits after the last prefill, keyed by its length: a request whose whole prompt is
        # already cached starts from these instead of re-running its last token, so repeating a
        # request reproduces its reply exactly (a 1-token re-run rounds differently).
        self.prefill_logits: tuple[int, np.ndarray] | None = None

    @property
    def n_tokens(self) -> int:
        """Positions filled (and committed)."""
        return len(self.tokens)

    @property
    def k_bits(self) -> np.ndarray:
        """The keys as float16 bit patterns (uint16), as the numba kernels take them."""
        return self.k.view(np.uint16)

    @property
    def v_bits(self) -> np.ndarray:
        return self.v.view(np.uint16)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def check_room(self, n_new: int) -> None:
        if self.n_tokens + n_new > self.n_ctx:
            raise ContextFullError(
                f"context is full: {self.n_tokens} cached + {n_new} new tokens > n_ctx {self.n_ctx}"
            )

    def write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store rows for positions ``start .. start+n`` of one layer; k, v are (n, kvh, hd).

        Values are rounded to f16 (nearest even), as in llama.cpp's default cache, so attention
        sees the same operands there and here (and a spill to an f16 sidecar is lossless)."""
        n = k.shape[0]
        self.k[layer, :, start : start + n] = k.transpose(1, 0, 2).astype(np.float16)
        self.v[layer, :, start : start + n] = v.transpose(1, 0, 2).astype(np.float16)

    def commit(self, tokens: list[int]) -> None:
        """Record that the rows written for ``tokens`` (after the current end) are valid."""
        self.check_room(len(tokens))
        self.tokens.extend(int(t) for t in tokens)

    def truncate(self, n: int) -> None:
        """Forget every position from ``n`` on (rows stay allocated and are overwritten later)."""
        del self.tokens[n:]
        if self.prefill_logits is not None and self.prefill_logits[0] > n:
            self.prefill_logits = None

    def common_prefix(self, tokens: list[int]) -> int:
        """Length of the longest common prefix of the cached tokens and ``tokens``."""
        n = min(len(self.tokens), len(tokens))
        for i in range(n):
            if self.tokens[i] != tokens[i]:
                return i
        return n

    def copy_rows_from(self, other: KVCache, n: int) -> None:
        """Replace this cache's contents with the first ``n`` positions of ``other``."""
        if other.geometry != self.geometry:
            raise ValueError(f"cannot copy rows between geometries {other.geometry} and {self.geometry}")
        if n > other.n_tokens or n > self.n_ctx:
            raise ValueError(f"cannot copy {n} rows: source has {other.n_tokens}, room {self.n_ctx}")
        self.k[:, :, :n] = other.k[:, :, :n]
        self.v[:, :, :n] = other.v[:, :, :n]
        self.tokens = list(other.tokens[:n])
        saved = other.prefill_logits
        self.prefill_logits = saved if saved is not None and saved[0] <= n else None
