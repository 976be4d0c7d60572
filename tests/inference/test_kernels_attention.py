"""The numba attention kernels (models/kernels.py) against the numpy reference in layers.py.

The kernels round q, the cached rows and the probabilities to f16 where the reference does, so
they differ only by float32 summation order, and rarely by one f16 step of one probability
that the order pushed across a rounding boundary: the tolerance is a few such steps.
"""

from __future__ import annotations

import numpy as np
import pytest

from inference.engine.kv_cache import KVCache, KVGeometry
from inference.engine.layers import ROPE_NEOX, ROPE_NORM, apply_rope, attention, rope_angles
from inference.engine.models.kernels import decode_attention, prefill_attention, round_f16_inplace

N_HEADS, N_KV, HEAD_DIM, N_CTX = 6, 2, 32, 64
TOLERANCE = 4 * 2.0**-11  # a few f16 steps of a probability, times |v| <= ~4


def _cache_with_rows(n: int, seed: int) -> KVCache:
    rng = np.random.default_rng(seed)
    cache = KVCache(KVGeometry(2, N_KV, HEAD_DIM, HEAD_DIM), N_CTX)
    k = rng.standard_normal((n, N_KV, HEAD_DIM)).astype(np.float32)  # (n, kvh, hd)
    v = rng.standard_normal((n, N_KV, HEAD_DIM)).astype(np.float32)  # (n, kvh, hd)
    cache.write(1, 0, k, v)
    cache.commit(list(range(n)))
    return cache


def test_round_f16_inplace_equals_numpy():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(50000) * 10.0 ** rng.integers(-9, 4, 50000)).astype(np.float32)
    x[:4] = [0.0, 2.0**-25, 3 * 2.0**-26, -(2.0**-24)]
    got = x.copy()
    round_f16_inplace(got)
    np.testing.assert_array_equal(
        got.view(np.uint32), x.astype(np.float16).astype(np.float32).view(np.uint32)
    )


@pytest.mark.parametrize("style", [ROPE_NORM, ROPE_NEOX])
@pytest.mark.parametrize("window", [0, 5])
def test_decode_attention_matches_reference(style, window):
    pos = 20
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, N_HEADS, HEAD_DIM)).astype(np.float32)  # (1, heads, hd)
    k = rng.standard_normal((1, N_KV, HEAD_DIM)).astype(np.float32)  # (1, kvh, hd)
    v = rng.standard_normal((1, N_KV, HEAD_DIM)).astype(np.float32)  # (1, kvh, hd)
    cos, sin = rope_angles(np.array([pos]), HEAD_DIM, 10000.0)
    expected_cache = _cache_with_rows(pos, seed=3)
    expected_cache.write(1, pos, apply_rope(k, cos, sin, style), v)
    expected = attention(apply_rope(q, cos, sin, style), expected_cache, 1, pos, 0.3, window)[0]

    cache = _cache_with_rows(pos, seed=3)
    got = np.empty((N_HEADS, HEAD_DIM), np.float32)  # (heads, hd)
    decode_attention(
        q[0].copy(),
        k[0].copy(),
        v[0].copy(),
        cos[0],
        sin[0],
        style == ROPE_NEOX,
        cache.k[1],
        cache.v[1],
        pos,
        window,
        np.float32(0.3),
        got,
    )
    np.testing.assert_array_equal(cache.k[1, :, pos], expected_cache.k[1, :, pos])
    np.testing.assert_array_equal(cache.v[1, :, pos], expected_cache.v[1, :, pos])
    np.testing.assert_allclose(got, expected, atol=TOLERANCE)


@pytest.mark.parametrize("start, n, window", [(0, 17, 0), (9, 12, 0), (9, 12, 4)])
def test_prefill_attention_matches_reference(start, n, window):
    cache = _cache_with_rows(start + n, seed=4)
    q = np.random.default_rng(5).standard_normal((n, N_HEADS, HEAD_DIM)).astype(np.float32)  # (n, heads, hd)
    expected = attention(q, cache, 1, start, 0.25, window)
    got = np.empty_like(expected)  # (n, heads, hd)
    prefill_attention(q, cache.k[1], cache.v[1], start, window, np.float32(0.25), got)
    np.testing.assert_allclose(got, expected, atol=TOLERANCE)
