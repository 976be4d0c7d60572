"""The tiled attention (fused/attention_tile.py) against the one-row kernels, bit for bit.

The tile puts 16 queries in the lanes of a vector and must give each the exact float32
operations of kernels.attend_head: every comparison here is bitwise (np.array_equal on the
bit patterns), over GQA groups, sliding windows, odd lengths and starts, partial vectors,
several key blocks and scores wide enough to push probabilities into f16 subnormals. The
numpy reference (layers.attention) is checked too, at the tolerance of its summation order.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

from inference.engine.fused.attention_tile import LANES, attend_rows_tiled, softmax_rows, tile_lanes
from inference.engine.fused.kernels import attend_rows, softmax_f16_inplace
from inference.engine.fused.step_attention import attend_items
from inference.engine.fused.step_kernels import CACHE_K
from inference.engine.kv_cache import KVCache, KVGeometry
from inference.engine.models.layers import attention

TOLERANCE = 4 * 2.0**-11  # tests/inference/engine/fused/test_kernels_attention.py


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32)


def _random_cache(n_kv: int, ctx: int, hd: int, seed: int, spread: float = 1.0):
    rng = np.random.default_rng(seed)
    k = (rng.standard_normal((n_kv, ctx, hd)) * spread).astype(np.float16)  # (kvh, ctx, hd)
    v = rng.standard_normal((n_kv, ctx, hd)).astype(np.float16)  # (kvh, ctx, hd)
    return k.view(np.uint16), v.view(np.uint16)


CASES = [
    # heads, kv heads, head_dim, start, rows, window, rows per tile
    (14, 2, 64, 0, 17, 0, 9),  # Qwen2.5's GQA, a prompt from row 0
    (14, 2, 64, 203, 31, 0, 4),  # several key blocks, a start off the 8-row grid
    (9, 3, 64, 37, 30, 0, 21),  # SmolLM2's group of 3, partial vectors
    (4, 1, 256, 100, 9, 16, 16),  # Gemma 3's head_dim, a window inside the block grid
    (4, 1, 256, 517, 40, 512, 16),  # a window of 512 sliding across blocks
    (6, 6, 8, 5, 11, 3, 2),  # no GQA, head_dim 8, a tiny window
    (8, 2, 24, 70, 1, 0, 1),  # one row (a decode step's shape), head_dim not a multiple of 16
]


@pytest.mark.parametrize("lanes", [16, 8])
@pytest.mark.parametrize("heads, n_kv, hd, start, n, window, per_tile", CASES)
def test_tiled_rows_equal_the_one_row_kernel_bitwise(heads, n_kv, hd, start, n, window, per_tile, lanes):
    keys, values = _random_cache(n_kv, start + n + 5, hd, seed=start + n)
    q = np.random.default_rng(n).standard_normal((n, heads, hd)).astype(np.float32)  # (n, heads, hd)
    expected = np.empty((n, heads, hd), np.float32)  # (n, heads, hd)
    attend_rows(q, keys, values, start, window, np.float32(0.125), expected)
    got = np.full((n, heads, hd), np.nan, np.float32)  # (n, heads, hd)
    attend_rows_tiled(q, keys, values, start, window, np.float32(0.125), got, per_tile, lanes)
    assert np.array_equal(_bits(got), _bits(expected))


@pytest.mark.parametrize("lanes", [16, 8])
def test_tiled_rows_equal_bitwise_where_probabilities_go_subnormal(lanes):
    # Scores spread over ~40 units: many exp(s - max) fall below f16's normal range.
    keys, values = _random_cache(2, 300, 64, seed=7, spread=6.0)
    q = (np.random.default_rng(8).standard_normal((13, 14, 64)) * 4).astype(np.float32)  # (13, 14, 64)
    expected, got = np.empty_like(q), np.empty_like(q)
    attend_rows(q, keys, values, 287, 0, np.float32(0.125), expected)
    attend_rows_tiled(q, keys, values, 287, 0, np.float32(0.125), got, 9, lanes)
    assert np.array_equal(_bits(got), _bits(expected))


def test_tiled_rows_agree_with_the_numpy_reference():
    cache = KVCache(KVGeometry(1, 2, 64, 64), 160)
    rng = np.random.default_rng(11)
    k = rng.standard_normal((150, 2, 64)).astype(np.float32)  # (n, kvh, hd)
    v = rng.standard_normal((150, 2, 64)).astype(np.float32)  # (n, kvh, hd)
    cache.write(0, 0, k, v)
    cache.commit(list(range(150)))
    q = rng.standard_normal((20, 14, 64)).astype(np.float32)  # (20, heads, hd)
    expected = attention(q, cache, 0, 130, 0.125, 0)
    got = np.empty_like(expected)  # (20, heads, hd)
    attend_rows_tiled(q, cache.k_bits[0], cache.v_bits[0], 130, 0, np.float32(0.125), got, 9, LANES)
    np.testing.assert_allclose(got, expected, atol=TOLERANCE)


@numba.njit(cache=True)
def _softmax_both(scores, first, last):
    """(lanes version, one-row version per lane) of the softmax of scores (rows, 16 or 8)."""
    lanes = scores.copy()
    softmax_rows(lanes, first, last)
    rows = np.zeros_like(scores)  # (rows, lanes)
    for i in range(scores.shape[1]):
        probs = scores[first[i] : last[i] + 1, i].copy()  # (keys of lane i,)
        softmax_f16_inplace(probs, first[i])
        rows[first[i] : last[i] + 1, i] = probs
    return lanes, rows


@pytest.mark.parametrize("lanes", [16, 8])
@pytest.mark.parametrize("seed", range(4))
def test_softmax_lanes_equal_the_one_row_softmax_bitwise(seed, lanes):
    rng = np.random.default_rng(seed)
    rows = 8 * int(rng.integers(1, 30))
    scores = (rng.standard_normal((rows, lanes)) * 10.0 ** rng.uniform(-2, 1.5)).astype(np.float32)
    first = rng.integers(0, rows, lanes)
    last = np.minimum(rows - 1, first + rng.integers(0, rows, lanes))
    got, expected = _softmax_both(scores, first, last)
    assert np.array_equal(_bits(got), _bits(expected))
    # every lane over every row: the max step skips its range test
    everything = np.zeros(lanes, np.int64), np.full(lanes, rows - 1, np.int64)
    got, expected = _softmax_both(scores, *everything)
    assert np.array_equal(_bits(got), _bits(expected))


def test_attend_items_cut_tiles_at_cache_changes_and_split_small_ones_by_head():
    # rows 0..19 of one cache, then 3 rows of three other caches (a lockstep batch)
    caches = np.zeros((23, 3), np.int64)
    caches[:20, CACHE_K] = 1000
    caches[20:, CACHE_K] = [2000, 3000, 4000]
    # 23 rows: tiles of ceil(23 / ATTEND_SPLIT) = 6 rows (a short chunk is split for the threads)
    items = attend_items(caches, 7, 2)  # 7 q heads per kv head, 2 kv heads
    assert (items[:, 2] >= 0).all()  # a lone row's 7 queries still fill an 8-lane vector
    cuts = [(0, 6), (6, 12), (12, 18), (18, 20)]
    assert items[:, :2].tolist() == [[r0, r1] for r0, r1 in cuts for _ in range(2)] + [
        [r, r + 1] for r in (20, 21, 22) for _ in range(2)
    ]
    items = attend_items(caches, 3, 3)  # 3 q heads per kv head: a lone row goes head by head
    single = items[items[:, 2] < 0]
    assert sorted(single[:, 0].tolist()) == sorted([20] * 9 + [21] * 9 + [22] * 9)
    assert sorted((-1 - single[single[:, 0] == 21, 2]).tolist()) == list(range(9))
    assert items[items[:, 2] >= 0][:, :2].tolist() == [[r0, r1] for r0, r1 in cuts for _ in range(3)]
    assert (tile_lanes(7), tile_lanes(8), tile_lanes(9)) == (8, 8, LANES)


def test_attend_items_of_a_long_run_fill_whole_tiles_and_of_a_short_one_keep_enough_queries():
    long_run = np.full((200, 3), 1000, np.int64)  # 200 rows of one cache
    assert attend_items(long_run, 7, 1)[:2, :2].tolist() == [[0, 9], [9, 18]]  # 64 // 7 rows per tile
    short = np.full((8, 3), 1000, np.int64)  # 8 rows, 2 q heads per kv head: 3 rows for 6 queries
    items = attend_items(short, 2, 1)
    assert items[:, :2].tolist() == [[0, 3], [3, 6], [6, 8], [6, 8]]  # the last 2 rows head by head
    assert (items[:2, 2] >= 0).all() and (items[2:, 2] < 0).all()


def test_a_strided_cache_view_is_refused_at_compile_time():
    # The kernels step through rows by their length: a slice of the last axis must not compile.
    keys, values = _random_cache(2, 40, 64, seed=3)
    q = np.zeros((4, 4, 32), np.float32)  # (n, heads, hd)
    with pytest.raises(numba.core.errors.TypingError):
        attend_rows_tiled(
            q, keys[:, :, :32], values[:, :, :32], 30, 0, np.float32(0.1), np.empty_like(q), 2, 16
        )
