"""The shape of one KV cache row, shared by the cache (kv_cache.py) and the prefixes installed
in it (prefix.py), which both import it from here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVGeometry:
    """What one cache row looks like; two caches can share rows only if these agree."""

    n_layers: int
    n_kv_heads: int
    head_dim_k: int
    head_dim_v: int

    def bytes_per_position(self, itemsize: int = 2) -> int:
        return self.n_layers * self.n_kv_heads * (self.head_dim_k + self.head_dim_v) * itemsize
