"""Per-conversation key/value cache.

Rows are positions: row ``i`` holds the keys and values of the token at position ``i``
(keys already normed and rotated), stored as float16 like llama.cpp's default cache: half
the memory of float32 and no loss, since every value is rounded to f16 anyway. ``tokens``
shadows the rows so a later request can find the longest common prefix with what is cached
and prefill only the rest.

A cache may start with ``prefix_rows`` rows that no token stands behind (a cartridge, or a
fleet's composition of several: :class:`inference.engine.prefix.KVPrefix`). They occupy rows
``[0, prefix_rows)``; real token ``i`` sits at position ``prefix_rows + i``. Everything that
speaks of tokens (``tokens``, ``n_tokens``, ``common_prefix``, ``truncate``) counts the real
tokens only, and ``n_positions`` is where the next row goes. Truncation never cuts into the
prefix: only installing another one replaces it.
"""

from __future__ import annotations

import numpy as np

from .heap import lazy_zeros
from .kv_geometry import KVGeometry
from .prefix import KVPrefix

__all__ = ["ContextFullError", "KVCache", "KVGeometry"]


class ContextFullError(ValueError):
    """A write would go past the cache's context length."""


class KVCache:
    """Keys and values for every layer, position-major within each kv head."""

    def __init__(self, geometry: KVGeometry, n_ctx: int):
        g = geometry
        self.geometry = g
        self.n_ctx = n_ctx
        # Pages taken as rows are written: a long context costs what it holds (heap.py).
        self.k = lazy_zeros((g.n_layers, g.n_kv_heads, n_ctx, g.head_dim_k), np.float16)  # (L, kvh, ctx, hd)
        self.v = lazy_zeros((g.n_layers, g.n_kv_heads, n_ctx, g.head_dim_v), np.float16)  # (L, kvh, ctx, hd)
        self.tokens: list[int] = []
        self.prefix_rows = 0  # rows [0, prefix_rows) hold a prefix with no token shadow
        self.prefix_key = ""  # names the installed prefix ("" for none): rows are shared under equal keys
        # The logits after the last prefill, keyed by its length: a request whose whole prompt is
        # already cached starts from these instead of re-running its last token, so repeating a
        # request reproduces its reply exactly (a 1-token re-run rounds differently).
        self.prefill_logits: tuple[int, np.ndarray] | None = None

    @property
    def n_tokens(self) -> int:
        """Real tokens committed (the prefix rows not counted)."""
        return len(self.tokens)

    @property
    def n_positions(self) -> int:
        """Rows filled: the prefix and the committed tokens; the next token's position."""
        return self.prefix_rows + len(self.tokens)

    def install_prefix(self, prefix: KVPrefix | None, key: str = "") -> None:
        """Make ``prefix`` (None: no prefix) the rows every token of this cache follows, under
        ``key``; the tokens cached behind the previous prefix are forgotten. Rows are rounded
        to f16 like every row the forward writes."""
        if prefix is None:
            rows = 0
        else:
            prefix.check_geometry(self.geometry)
            rows = prefix.rows
            if rows >= self.n_ctx:
                raise ContextFullError(f"a prefix of {rows} rows leaves no room in a context of {self.n_ctx}")
            self.k[:, :, :rows] = prefix.k.astype(np.float16)
            self.v[:, :, :rows] = prefix.v.astype(np.float16)
        self.prefix_rows, self.prefix_key = rows, key if prefix is not None else ""
        self.tokens = []
        self.prefill_logits = None

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
        if self.n_positions + n_new > self.n_ctx:
            prefix = f" (after {self.prefix_rows} prefix rows)" if self.prefix_rows else ""
            raise ContextFullError(
                f"context is full: {self.n_tokens} cached{prefix} + {n_new} new tokens > n_ctx {self.n_ctx}"
            )

    def write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store rows for positions ``start .. start+n`` of one layer; k, v are (n, kvh, hd).
        ``start`` is a position (prefix rows included), not a token index.

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
        """Forget every token from the ``n``-th on (rows stay allocated and are overwritten
        later); the prefix rows stay."""
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
        """Replace this cache's contents with ``other``'s prefix and its first ``n`` tokens."""
        if other.geometry != self.geometry:
            raise ValueError(f"cannot copy rows between geometries {other.geometry} and {self.geometry}")
        rows = other.prefix_rows + n
        if n > other.n_tokens or rows > self.n_ctx:
            raise ValueError(f"cannot copy {n} tokens: source has {other.n_tokens}, room {self.n_ctx}")
        self.k[:, :, :rows] = other.k[:, :, :rows]
        self.v[:, :, :rows] = other.v[:, :, :rows]
        self.prefix_rows, self.prefix_key = other.prefix_rows, other.prefix_key
        self.tokens = list(other.tokens[:n])
        saved = other.prefill_logits
        self.prefill_logits = saved if saved is not None and saved[0] <= n else None
