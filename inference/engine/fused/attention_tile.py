"""Attention for a tile of query heads that share one kv head and one cache: 16 (or 8) queries
per vector, several vectors per tile, every key and value row converted once per tile.

A prefill chunk over a long cache spends its time in attention, and the one-row kernels
(kernels.attend_head) stream every key and value once per (row, head). Here the queries of R
consecutive rows times the G heads of one kv group (GQA) sit in the lanes of vectors
(lane = one query), so a key row is read once for all of them. Each lane still performs the
one-row kernel's float32 operations in the same order (attention_tile_ir.py):

1. scores: scale * q . k per key, tinyBLAS's 8-lane FMA order and hsum8;
2. softmax (llama.cpp's): max over the lane's own keys, ggml's expf, float sums of 8-row blocks
   aligned to cache row 0 added in float64, probabilities times float32(1 / sum), f16-rounded;
3. weighted values: key t in accumulator lane (t mod 8), FMA per lane, hsum8.

The softmax's max runs block by block inside step 1 and its last step (probabilities) block by
block inside step 3, while the block is in L1: only the exponentials make a pass of their own
over the tile's scores, which at 27k keys (7 MB) live in L3 or memory.

Keys outside a lane's own range (later rows of the tile, the part before a sliding window, the
padding of the first block) get probability exactly 0: they add +0.0 to block sums that are
then >= 1, and fma(v, 0, acc) == acc for the finite values of the cache (acc starts at +0.0 and
is never -0.0). So each lane's output has the one-row kernel's bits: tests compare bitwise.
"""

from __future__ import annotations

import numba
import numpy as np

from ..jit.kernel_only import kernel_only
from ..jit.simd import target_features
from .attention_tile_ir import (
    halves_f16c,
    halves_generic,
    scores_lanes8,
    scores_lanes16,
    values_lanes8,
    values_lanes16,
)
from .ggml_math import hsum8
from .kernels import HOST_F16C, round_f16_inplace
from .softmax_ir import (
    exp_lanes8,
    exp_lanes16,
    max_all8,
    max_all16,
    max_lanes8,
    max_lanes16,
    scale_lanes8,
    scale_lanes16,
)

# Queries per vector: 16 where the CPU has AVX-512's 32 registers, else 8 (AVX2's 16 registers
# would spill 16-wide accumulators). Both widths are compiled and tested; the bits are the same.
LANES = 16 if "avx512f" in target_features() else 8
BLOCK = 64  # keys converted to float32 at a time (a multiple of 8: blocks keep key t in lane t mod 8)
# Values converted at a time: the weighted-values kernel keeps its accumulators in registers for
# the VALUE_BLOCK / 8 keys of each accumulator lane, so a longer block loads and stores them less
# often (0.89 -> 0.73 ns per (query, key) from 64 to 256 at 8k keys); 256 rows of f32 values
# and a vector's probabilities are 64 KB + 16 KB, in L2.
VALUE_BLOCK = 256
TILE_QUERIES = 64  # queries per tile: rows x the q heads of one kv head
# A tile of this many queries or fewer goes in one 8-lane vector (on an AVX-512 core 8 lanes
# cost ~1.75x the time of 16 for half the work); fewer than MIN_TILE_QUERIES go one head at a
# time instead. Per useful query an 8-lane vector costs 4.9 ns x 8 / used lanes per key against
# 6.3-7.5 ns for the one-row kernel (bench/lab/attention_kernel.py, head_dim 64): 6 lanes break even,
# 7 win 1.3x. A decode step of Qwen2.5 (7 q heads per kv head) is one 8-lane tile per kv head;
# SmolLM2 (3) and Gemma 3 (4) decode one head at a time.
NARROW_QUERIES = 8
MIN_TILE_QUERIES = 6


@numba.njit(cache=True)
def tile_lanes(n_queries):
    """Lanes per vector for a tile of n_queries queries."""
    return 8 if n_queries <= NARROW_QUERIES else LANES


@numba.njit(cache=True)
def tile_vectors(n_queries, lanes):
    """Vectors of ``lanes`` queries for n_queries queries."""
    return -(-n_queries // lanes)


@numba.njit(cache=True)
def tile_rows(group):
    """Rows per tile for ``group`` q heads per kv head."""
    return max(1, TILE_QUERIES // group)


@numba.njit(cache=True)
def tile_scratch_size(n_vecs, n_keys, hd, hd_v, lanes):
    """float32 elements of the work buffer of attend_tile over up to n_keys cache rows: scores
    (vecs, keys + 16, lanes), key and value blocks, a value block's probabilities, accumulators
    (vecs, 8, hd_v, lanes), the softmax's max and inverse sum (2, vecs, lanes)."""
    blocks = BLOCK * hd + VALUE_BLOCK * (hd_v + lanes)
    return n_vecs * (n_keys + 16) * lanes + blocks + n_vecs * 8 * hd_v * lanes + 2 * n_vecs * lanes


@numba.njit(cache=True)
def attend_scratch_size(n_keys, hd, hd_v, group):
    """float32 elements of one thread's attention scratch in the fused forward: a tile's work
    buffer (LANES-wide) over up to n_keys cache rows, or the scores of one row."""
    n_vecs = tile_vectors(tile_rows(group) * group, np.int64(LANES))  # not a literal: one variant
    return max(n_keys, tile_scratch_size(n_vecs, n_keys + 8, hd, hd_v, LANES))


# halves_into(src, t0, n, dst): dst[b, :] = float32 of the f16 bits src[t0 + b, :] for b < n,
# 8 at a time; both selections give the same (exact) values, the host's is used.
halves_into = halves_f16c if HOST_F16C else halves_generic


@numba.njit(cache=True)
def _block_max(scores, r0, r1, first, last, top):
    """top (lanes,) := max(top, each lane's own scores of rows r0..r1); the range test only
    where some lane's range starts or ends inside the block (the diagonal, a window's edge)."""
    if scores.shape[1] == 16:
        if first.max() <= r0 and last.min() >= r1 - 1:
            max_all16(scores, r0, r1, first, last, top)
        else:
            max_lanes16(scores, r0, r1, first, last, top)
    elif first.max() <= r0 and last.min() >= r1 - 1:
        max_all8(scores, r0, r1, first, last, top)
    else:
        max_lanes8(scores, r0, r1, first, last, top)


@numba.njit(cache=True)
def _scores_pass(q_lanes, keys, base, end, scale, scores, key_block, first, last, top):
    """scores[v, t - base] for cache rows base..end of every vector's queries, and top[v] the
    max of each lane's own scores (first/last relative to base), block by block in row order."""
    for b0 in range(base, end, BLOCK):
        n = min(BLOCK, end - b0)
        halves_into(keys, b0, n, key_block)
        r0 = b0 - base
        for v in range(q_lanes.shape[0]):
            if q_lanes.shape[2] == 16:
                scores_lanes16(q_lanes[v], key_block, n, scale, scores[v], r0)
            else:
                scores_lanes8(q_lanes[v], key_block, n, scale, scores[v], r0)
            _block_max(scores[v], r0, r0 + n, first[v], last[v], top[v])


@numba.njit(cache=True)
def _exp_pass(scores, first, last, top, inverse):
    for v in range(scores.shape[0]):
        if scores.shape[2] == 16:
            exp_lanes16(scores[v], first[v], last[v], top[v], inverse[v])
        else:
            exp_lanes8(scores[v], first[v], last[v], top[v], inverse[v])


@numba.njit(cache=True)
def _values_pass(scores, values, base, end, inverse, value_block, probs, acc):
    """acc[v] += the weighted values of cache rows base..end; each block's exponentials become
    probabilities (times inverse[v], f16-rounded, into probs (VALUE_BLOCK, lanes)) just before
    they weigh its values."""
    acc[:] = 0.0
    for b0 in range(base, end, VALUE_BLOCK):
        n = min(VALUE_BLOCK, end - b0)
        halves_into(values, b0, n, value_block)
        r0 = b0 - base
        for v in range(scores.shape[0]):
            if scores.shape[2] == 16:
                scale_lanes16(scores[v], r0, r0 + n, inverse[v], probs)
                values_lanes16(probs, 0, value_block, n, acc[v])
            else:
                scale_lanes8(scores[v], r0, r0 + n, inverse[v], probs)
                values_lanes8(probs, 0, value_block, n, acc[v])


@numba.njit(cache=True)
def softmax_rows(scores, first, last):
    """The tile's softmax on its own, in place over scores (rows, lanes) (rows a multiple of 8,
    row 0 on the 8-row grid): lane l's f16-rounded probabilities over rows first[l]..last[l],
    0 elsewhere. attend_tile runs the same three steps interleaved with its products."""
    lanes = scores.shape[1]
    top = np.full(lanes, -np.inf, np.float32)  # (lanes,)
    inverse = np.empty(lanes, np.float32)  # (lanes,)
    n = scores.shape[0]
    _block_max(scores, 0, n, first, last, top)
    if lanes == 16:
        exp_lanes16(scores, first, last, top, inverse)
        scale_lanes16(scores, 0, n, inverse, scores)
    else:
        exp_lanes8(scores, first, last, top, inverse)
        scale_lanes8(scores, 0, n, inverse, scores)


@kernel_only()
def attend_tile(q_lanes, first, last, keys, values, scale, work, out):
    """Attention of the queries q_lanes (vecs, hd, lanes) (rotated, f16-rounded; lane l of
    vector v attends cache rows first[v, l]..last[v, l]) over keys and values (ctx, hd) of f16
    bits; writes out (vecs, lanes, hd_v). ``work``: float32 scratch of tile_scratch_size."""
    n_vecs, hd, lanes, hd_v = q_lanes.shape[0], q_lanes.shape[1], q_lanes.shape[2], values.shape[1]
    lo, end = first.min(), last.max() + 1
    base = lo - lo % 8  # blocks of 8 rows aligned to cache row 0 (softmax sums, value lanes)
    rows = -(-(end - base) // 8) * 8
    at = n_vecs * rows * lanes
    scores = work[:at].reshape((n_vecs, rows, lanes))  # (vecs, keys, lanes)
    key_block = work[at : at + BLOCK * hd].reshape((BLOCK, hd))  # (BLOCK, hd)
    at += BLOCK * hd
    value_block = work[at : at + VALUE_BLOCK * hd_v].reshape((VALUE_BLOCK, hd_v))  # (VALUE_BLOCK, hd_v)
    at += VALUE_BLOCK * hd_v
    probs = work[at : at + VALUE_BLOCK * lanes].reshape((VALUE_BLOCK, lanes))  # (VALUE_BLOCK, lanes)
    at += VALUE_BLOCK * lanes
    n_acc = n_vecs * 8 * hd_v * lanes
    acc = work[at : at + n_acc].reshape((n_vecs, 8, hd_v, lanes))  # (vecs, 8, hd_v, lanes)
    at += n_acc
    top = work[at : at + n_vecs * lanes].reshape((n_vecs, lanes))  # (vecs, lanes)
    inverse = work[at + n_vecs * lanes : at + 2 * n_vecs * lanes].reshape((n_vecs, lanes))  # (vecs, lanes)
    top[:] = -np.inf
    first_rel, last_rel = first - base, last - base  # (vecs, lanes) rows of the scores buffer
    _scores_pass(q_lanes, keys, base, end, scale, scores, key_block, first_rel, last_rel, top)
    _exp_pass(scores, first_rel, last_rel, top, inverse)
    _values_pass(scores, values, base, end, inverse, value_block, probs, acc)
    for v in range(n_vecs):
        for d in range(hd_v):
            for i in range(lanes):
                a = acc[v, :, d, i]  # (8,) the accumulator lanes of one output
                out[v, i, d] = hsum8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7])


@numba.njit(cache=True)
def set_lane(q_lanes, first, last, k, q, pos, window):
    """Query k of a tile (vector k // lanes, lane k % lanes): q (hd,) rotated and f16-rounded,
    at ``pos``, attending the last ``window`` rows if > 0."""
    v, i = k // q_lanes.shape[2], k % q_lanes.shape[2]
    for d in range(q.shape[0]):
        q_lanes[v, d, i] = q[d]
    first[v, i] = max(0, pos + 1 - window) if window > 0 else 0
    last[v, i] = pos


@numba.njit(cache=True)
def pad_lanes(q_lanes, first, last, n_queries):
    """Lanes from n_queries on: zero queries over query 0's rows (finite, then discarded)."""
    lanes = q_lanes.shape[2]
    for k in range(n_queries, q_lanes.shape[0] * lanes):
        v, i = k // lanes, k % lanes
        q_lanes[v, :, i] = 0.0
        first[v, i], last[v, i] = first[0, 0], last[0, 0]


@numba.njit(parallel=True, cache=True)
def attend_rows_tiled(q, cache_k, cache_v, start, window, scale, out, rows_per_tile, lanes):
    """kernels.attend_rows with the same bits, by tiles of ``rows_per_tile`` rows times the
    heads of one kv head in vectors of ``lanes`` (16 or 8) queries: q (n, heads, hd) rotated,
    at positions start..start+n, over cache rows (kvh, ctx, hd) of f16 bits that already hold
    the new rows; writes out (n, heads, hd_v)."""
    n, n_heads, hd = q.shape
    n_kv, hd_v = cache_k.shape[0], cache_v.shape[2]
    group = n_heads // n_kv
    n_tiles = -(-n // rows_per_tile)
    for item in numba.prange(n_tiles * n_kv):
        r0, g = (item // n_kv) * rows_per_tile, item % n_kv
        r1 = min(n, r0 + rows_per_tile)
        n_queries = (r1 - r0) * group
        n_vecs = tile_vectors(n_queries, lanes)
        q_lanes = np.empty((n_vecs, hd, lanes), np.float32)  # (vecs, hd, lanes)
        first = np.empty((n_vecs, lanes), np.int64)  # (vecs, lanes)
        last = np.empty((n_vecs, lanes), np.int64)  # (vecs, lanes)
        for k in range(n_queries):
            r, h = r0 + k // group, g * group + k % group
            qh = q[r, h].copy()  # (hd,)
            round_f16_inplace(qh)
            set_lane(q_lanes, first, last, k, qh, start + r, window)
        pad_lanes(q_lanes, first, last, n_queries)
        work = np.empty(tile_scratch_size(n_vecs, start + r1 + 8, hd, hd_v, lanes), np.float32)
        res = np.empty((n_vecs, lanes, hd_v), np.float32)  # (vecs, lanes, hd_v)
        attend_tile(q_lanes, first, last, cache_k[g], cache_v[g], scale, work, res)
        for k in range(n_queries):
            out[r0 + k // group, g * group + k % group] = res[k // lanes, k % lanes]
