"""KV prefixes: cache rows that sit before a conversation's tokens without any token behind them.

A cartridge (a trained KV prefix) and a fleet's composition of several cartridges are both a
:class:`KVPrefix`: per layer, keys (already normed and rotated at their own positions) and values
for ``rows`` positions. Installed in a cache, they occupy rows ``[0, rows)``; the conversation's
first real token sits at position ``rows``. Composition is concatenation: each part keeps the
rotations it was trained at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .kv_geometry import KVGeometry


class PrefixMismatchError(ValueError):
    """A prefix does not fit the model it is used with (geometry or identity)."""


@dataclass(frozen=True, eq=False)
class KVPrefix:
    """Keys and values of ``rows`` prefix positions for every layer, in the cache's layout."""

    k: np.ndarray  # (n_layers, n_kv_heads, rows, head_dim_k) float32
    v: np.ndarray  # (n_layers, n_kv_heads, rows, head_dim_v) float32

    def __post_init__(self):
        if self.k.ndim != 4 or self.v.ndim != 4 or self.k.shape[:3] != self.v.shape[:3]:
            raise PrefixMismatchError(f"prefix keys {self.k.shape} and values {self.v.shape} disagree")

    @property
    def rows(self) -> int:
        return int(self.k.shape[2])

    @property
    def geometry(self) -> KVGeometry:
        n_layers, n_kv_heads, _, head_dim_k = self.k.shape
        return KVGeometry(n_layers, n_kv_heads, head_dim_k, int(self.v.shape[3]))

    @property
    def nbytes_f16(self) -> int:
        """What the prefix costs in an f16 cache."""
        return (self.k.size + self.v.size) * 2

    def check_geometry(self, geometry: KVGeometry) -> None:
        """Raise PrefixMismatchError naming the first dimension that differs."""
        if self.geometry != geometry:
            raise PrefixMismatchError(
                f"the prefix's KV geometry {self.geometry} does not match the model's {geometry}"
            )

    @classmethod
    def empty(cls, geometry: KVGeometry) -> KVPrefix:
        """No rows at all (a fleet conversation none of whose documents could be read)."""
        g = geometry
        return cls(
            np.zeros((g.n_layers, g.n_kv_heads, 0, g.head_dim_k), np.float32),
            np.zeros((g.n_layers, g.n_kv_heads, 0, g.head_dim_v), np.float32),
        )

    @classmethod
    def concat(cls, parts: Sequence[KVPrefix]) -> KVPrefix:
        """The parts one after another (a fleet composition); every part's geometry must agree."""
        if not parts:
            raise ValueError("a composition needs at least one part")
        for part in parts[1:]:
            part.check_geometry(parts[0].geometry)
        return cls(np.concatenate([p.k for p in parts], axis=2), np.concatenate([p.v for p in parts], axis=2))
