"""The numba attention kernels (fused/kernels.py) against the numpy reference in models/layers.py.

The kernels round q, the cached rows and the probabilities to f16 where the reference does, so
they differ only by float32 summation order, and rarely by one f16 step of one probability
that the order pushed across a rounding boundary: the tolerance is a few such steps. The f16
conversions themselves are exact and checked bit for bit.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

from inference.engine.fused.kernels import (
    HOST_F16C,
    attend_rows,
    half_value_f16c,
    half_value_generic,
    rope_inplace,
    round_f16_inplace,
    scores_into_f16c,
    scores_into_generic,
    store_half,
)
from inference.engine.kv_cache import KVCache, KVGeometry
from inference.engine.models.layers import ROPE_NEOX, ROPE_NORM, apply_rope, attention, rope_angles

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


def _wide_range_values(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(50000) * 10.0 ** rng.integers(-9, 4, 50000)).astype(np.float32)
    x[:4] = [0.0, 2.0**-25, 3 * 2.0**-26, -(2.0**-24)]
    return x


def test_round_f16_inplace_equals_numpy():
    x = _wide_range_values(1)
    got = x.copy()
    round_f16_inplace(got)
    np.testing.assert_array_equal(
        got.view(np.uint32), x.astype(np.float16).astype(np.float32).view(np.uint32)
    )


@numba.njit(cache=True)
def _half_values(bits, convert):
    out = np.empty(bits.shape[0], np.float32)  # (n,)
    for i in range(bits.shape[0]):
        out[i] = convert(bits[i])
    return out


def test_f16_store_and_read_equal_numpy_float16():
    x = _wide_range_values(2)
    bits = np.empty(x.shape[0], np.uint16)
    store_half(x, bits)
    np.testing.assert_array_equal(bits, x.astype(np.float16).view(np.uint16))
    every_finite = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    every_finite = every_finite[np.isfinite(every_finite.view(np.float16))]
    expected = every_finite.view(np.float16).astype(np.float32)
    np.testing.assert_array_equal(_half_values(every_finite, half_value_generic), expected)
    if HOST_F16C:  # the conversion the host uses, when it has F16C
        np.testing.assert_array_equal(_half_values(every_finite, half_value_f16c), expected)


def test_kv_cache_holds_float16_at_half_the_bytes():
    cache = KVCache(KVGeometry(2, N_KV, HEAD_DIM, HEAD_DIM), N_CTX)
    assert cache.k.dtype == np.float16 and cache.k_bits.dtype == np.uint16
    assert cache.nbytes == cache.geometry.bytes_per_position() * N_CTX == 2 * 2 * N_KV * HEAD_DIM * 2 * N_CTX


@pytest.mark.parametrize("style", [ROPE_NORM, ROPE_NEOX])
def test_rope_inplace_equals_apply_rope(style):
    x = np.random.default_rng(3).standard_normal((5, 1, HEAD_DIM)).astype(np.float32)
    cos, sin = rope_angles(np.arange(40, 45), HEAD_DIM, 10000.0)
    expected = apply_rope(x, cos, sin, style)
    for i in range(5):
        row = x[i, 0].copy()
        rope_inplace(row, cos[i], sin[i], style == ROPE_NEOX)
        np.testing.assert_array_equal(row, expected[i, 0])


def test_rope_angles_are_a_running_product_in_float32():
    # ggml: theta starts at the position and is multiplied by base**(-2/n_rot) pair by pair.
    cos, sin = rope_angles(np.array([0, 7, 1000]), 8, 10000.0)
    scale = np.float32(10000.0) ** np.float32(-2.0 / 8)
    theta = np.float32(1000.0)
    for j in range(4):
        assert (
            abs(cos[2, j] - np.cos(np.float64(theta))) < 1e-6
            and abs(sin[2, j] - np.sin(np.float64(theta))) < 1e-6
        )
        theta = np.float32(theta * scale)
    np.testing.assert_array_equal(cos[0], np.ones(4, np.float32))


@pytest.mark.parametrize("start, n, window", [(0, 17, 0), (9, 12, 0), (9, 12, 4), (20, 1, 0), (20, 1, 5)])
def test_attend_rows_matches_reference(start, n, window):
    cache = _cache_with_rows(start + n, seed=4)
    q = np.random.default_rng(5).standard_normal((n, N_HEADS, HEAD_DIM)).astype(np.float32)  # (n, heads, hd)
    expected = attention(q, cache, 1, start, 0.25, window)
    got = np.empty_like(expected)  # (n, heads, hd)
    attend_rows(q, cache.k_bits[1], cache.v_bits[1], start, window, np.float32(0.25), got)
    np.testing.assert_allclose(got, expected, atol=TOLERANCE)
    # A row's output does not depend on the rows computed with it.
    last = np.empty_like(got[-1:])
    attend_rows(
        q[-1:].copy(), cache.k_bits[1], cache.v_bits[1], start + n - 1, window, np.float32(0.25), last
    )
    np.testing.assert_array_equal(last, got[-1:])


def test_score_selections_give_the_same_bits_and_the_dot_product():
    rng = np.random.default_rng(9)
    keys = (rng.standard_normal((40, HEAD_DIM)) * 3).astype(np.float16)
    keys[0, :8] = [6e-8, -6e-8, 1e-5, -1e-5, 0.0, -0.0, 65504.0, -65504.0]  # subnormals, zeros, extremes
    q = rng.standard_normal(HEAD_DIM).astype(np.float32)
    generic = np.empty(40, np.float32)
    scores_into_generic(q, keys.view(np.uint16), 0, 40, np.float32(0.5), generic)
    expected = 0.5 * (keys.astype(np.float64) @ q.astype(np.float64))
    np.testing.assert_allclose(generic, expected, rtol=1e-5, atol=1e-3)
    if HOST_F16C:
        f16c = np.empty(40, np.float32)
        scores_into_f16c(q, keys.view(np.uint16), 0, 40, np.float32(0.5), f16c)
        np.testing.assert_array_equal(f16c, generic)
