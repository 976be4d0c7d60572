"""A cartridge's starting point: the model's own keys and values of the corpus's first tokens.

Untrained, such a cartridge is exactly the prefill of those tokens: installed as a prefix, the
logits of any suffix equal the logits after the real tokens plus the suffix (the engine's one
exact arithmetic; the cache's f16 rows survive the float32 round trip unchanged). Training then
moves it from there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from inference.engine.engine import Engine

from .file import Cartridge


def initial_cartridge(
    engine: Engine, tokens: Sequence[int], frozen_rows: int = 1, training: dict | None = None
) -> Cartridge:
    """Prefill ``tokens`` (the corpus's first p tokens, BOS included when the model adds one)
    into a fresh cache and keep its rows as a cartridge of p rows."""
    p = len(tokens)
    if p < 1:
        raise ValueError("a cartridge needs at least one row")
    if not 0 <= frozen_rows <= p:
        raise ValueError(f"frozen_rows {frozen_rows} must be within 0..{p}")
    cache = engine.new_cache(p)
    engine.prefill(cache, list(tokens))
    k = cache.k[:, :, :p].astype(np.float32)  # (L, kvh, p, hd_k)
    v = cache.v[:, :, :p].astype(np.float32)  # (L, kvh, p, hd_v)
    provenance = {"method": "initial", "steps": 0, **(training or {})}
    return Cartridge(k, v, engine.fingerprint, frozen_rows, provenance)
