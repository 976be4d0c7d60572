"""Attention for a tile of query heads that share one kv head and one cache: up to 16 queries
per vector, several vectors per tile, every key and value row converted once per tile.

A prefill chunk over a long cache spends its time in attention, and the one-row kernels
(kernels.attend_head) stream every key and value once per (row, head). Here the queries of R
consecutive rows times the G heads of one kv group (GQA) sit in the lanes of 16-wide vectors
(lane = one query), so a key row is read once for all of them. Each lane still performs the
one-row kernel's float32 operations in the same order (attention_tile_ir.py):

1. scores: scale * q . k per key, tinyBLAS's 8-lane FMA order and hsum8;
2. softmax (llama.cpp's): max over the lane's own keys, ggml's expf, float sums of 8-row blocks
   aligned to cache row 0 added in float64, probabilities times float32(1 / sum), f16-rounded;
3. weighted values: key t in accumulator lane (t mod 8), FMA per lane, hsum8.

Keys outside a lane's own range (later rows of the tile, the part before a sliding window, the
padding of the first block) get probability exactly 0: they add +0.0 to block sums that are
then >= 1, and fma(v, 0, acc) == acc for the finite values of the cache (acc starts at +0.0 and
is never -0.0). So each lane's output has the one-row kernel's bits: tests compare bitwise.
"""

from __future__ import annotations

import numba
import numpy as np

from ..ggml_math import hsum8
from .attention_tile_ir import QUERIES, halves_f16c, halves_generic, scores_lanes, values_lanes
from .kernels import HOST_F16C, round_f16_inplace
from .softmax_ir import softmax_lanes

BLOCK = 64  # keys converted to float32 at a time (a multiple of 8: blocks keep key t in lane t mod 8)
TILE_QUERIES = 64  # queries per tile: rows x the q heads of one kv head, 4 vectors
MIN_TILE_QUERIES = 8  # fewer fill too little of a vector: such rows go one head at a time


@numba.njit(cache=True)
def tile_vectors(n_queries):
    """16-lane vectors for n_queries queries."""
    return -(-n_queries // QUERIES)


@numba.njit(cache=True)
def tile_rows(group):
    """Rows per tile for ``group`` q heads per kv head."""
    return max(1, TILE_QUERIES // group)


@numba.njit(cache=True)
def attend_scratch_size(n_keys, hd, hd_v, group):
    """float32 elements of one thread's attention scratch: a tile's work buffer over up to
    n_keys cache rows, or the scores of one row."""
    return max(n_keys, tile_scratch_size(tile_vectors(tile_rows(group) * group), n_keys + 8, hd, hd_v))


@numba.njit(cache=True)
def tile_scratch_size(n_vecs, n_keys, hd, hd_v):
    """float32 elements of the work buffer of attend_tile: scores (vecs, keys + 16, 16), key and
    value blocks, lane accumulators (vecs, 8, hd_v, 16)."""
    return n_vecs * (n_keys + 16) * QUERIES + BLOCK * (hd + hd_v) + n_vecs * 8 * hd_v * QUERIES


# halves_into(src, t0, n, dst): dst[b, :] = float32 of the f16 bits src[t0 + b, :] for b < n,
# 8 at a time; both selections give the same (exact) values, the host's is used.
halves_into = halves_f16c if HOST_F16C else halves_generic


@numba.njit(cache=True)
def _scores_pass(q_lanes, keys, base, end, scale, scores, key_block):
    """scores[v, t - base] for cache rows base..end of every vector's queries."""
    for b0 in range(base, end, BLOCK):
        n = min(BLOCK, end - b0)
        halves_into(keys, b0, n, key_block)
        for v in range(q_lanes.shape[0]):
            scores_lanes(q_lanes[v], key_block, n, scale, scores[v], b0 - base)


@numba.njit(cache=True)
def _values_pass(scores, values, base, end, value_block, lanes):
    """lanes[v] += the weighted values of cache rows base..end (scores now probabilities)."""
    lanes[:] = 0.0
    for b0 in range(base, end, BLOCK):
        n = min(BLOCK, end - b0)
        halves_into(values, b0, n, value_block)
        for v in range(scores.shape[0]):
            values_lanes(scores[v], b0 - base, value_block, n, lanes[v])


@numba.njit(cache=True)
def attend_tile(q_lanes, first, last, keys, values, scale, work, out):
    """Attention of the queries q_lanes (vecs, hd, 16) (rotated, f16-rounded; lane l of vector v
    attends cache rows first[v, l]..last[v, l]) over keys and values (ctx, hd) of f16 bits;
    writes out (vecs, 16, hd_v). ``work``: float32 scratch of tile_scratch_size elements."""
    n_vecs, hd, hd_v = q_lanes.shape[0], q_lanes.shape[1], values.shape[1]
    lo, end = first.min(), last.max() + 1
    base = lo - lo % 8  # blocks of 8 rows aligned to cache row 0 (softmax sums, value lanes)
    rows = -(-(end - base) // 8) * 8
    at = n_vecs * rows * QUERIES
    scores = work[:at].reshape((n_vecs, rows, QUERIES))  # (vecs, keys, 16)
    key_block = work[at : at + BLOCK * hd].reshape((BLOCK, hd))  # (BLOCK, hd)
    at += BLOCK * hd
    value_block = work[at : at + BLOCK * hd_v].reshape((BLOCK, hd_v))  # (BLOCK, hd_v)
    at += BLOCK * hd_v
    lanes = work[at : at + n_vecs * 8 * hd_v * QUERIES]
    lanes = lanes.reshape((n_vecs, 8, hd_v, QUERIES))  # (vecs, 8, hd_v, 16)
    _scores_pass(q_lanes, keys, base, end, scale, scores, key_block)
    for v in range(n_vecs):
        softmax_lanes(scores[v], first[v] - base, last[v] - base)
    _values_pass(scores, values, base, end, value_block, lanes)
    for v in range(n_vecs):
        acc = lanes[v]
        for d in range(hd_v):
            for i in range(QUERIES):
                a = acc[:, d, i]  # (8,) the lanes of one output
                out[v, i, d] = hsum8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7])


@numba.njit(cache=True)
def set_lane(q_lanes, first, last, k, q, pos, window):
    """Query k of a tile (vector k // 16, lane k % 16): q (hd,) rotated and f16-rounded, at
    ``pos``, attending the last ``window`` rows if > 0."""
    v, i = k // QUERIES, k % QUERIES
    for d in range(q.shape[0]):
        q_lanes[v, d, i] = q[d]
    first[v, i] = max(0, pos + 1 - window) if window > 0 else 0
    last[v, i] = pos


@numba.njit(cache=True)
def pad_lanes(q_lanes, first, last, n_queries):
    """Lanes from n_queries on: zero queries over query 0's rows (finite, then discarded)."""
    for k in range(n_queries, q_lanes.shape[0] * QUERIES):
        v, i = k // QUERIES, k % QUERIES
        q_lanes[v, :, i] = 0.0
        first[v, i], last[v, i] = first[0, 0], last[0, 0]


@numba.njit(parallel=True, cache=True)
def attend_rows_tiled(q, cache_k, cache_v, start, window, scale, out, rows_per_tile):
    """kernels.attend_rows with the same bits, by tiles of ``tile_rows`` rows times the heads
    of one kv head: q (n, heads, hd) rotated, at positions start..start+n, over cache rows
    (kvh, ctx, hd) of f16 bits that already hold the new rows; writes out (n, heads, hd_v)."""
    n, n_heads, hd = q.shape
    n_kv, hd_v = cache_k.shape[0], cache_v.shape[2]
    group = n_heads // n_kv
    n_tiles = -(-n // rows_per_tile)
    for item in numba.prange(n_tiles * n_kv):
        r0, g = (item // n_kv) * rows_per_tile, item % n_kv
        r1 = min(n, r0 + rows_per_tile)
        n_queries = (r1 - r0) * group
        n_vecs = tile_vectors(n_queries)
        q_lanes = np.empty((n_vecs, hd, QUERIES), np.float32)  # (vecs, hd, 16)
        first = np.empty((n_vecs, QUERIES), np.int64)  # (vecs, 16)
        last = np.empty((n_vecs, QUERIES), np.int64)  # (vecs, 16)
        for k in range(n_queries):
            r, h = r0 + k // group, g * group + k % group
            qh = q[r, h].copy()  # (hd,)
            round_f16_inplace(qh)
            set_lane(q_lanes, first, last, k, qh, start + r, window)
        pad_lanes(q_lanes, first, last, n_queries)
        work = np.empty(tile_scratch_size(n_vecs, start + r1 + 8, hd, hd_v), np.float32)
        res = np.empty((n_vecs, QUERIES, hd_v), np.float32)  # (vecs, 16, hd_v)
        attend_tile(q_lanes, first, last, cache_k[g], cache_v[g], scale, work, res)
        for k in range(n_queries):
            out[r0 + k // group, g * group + k % group] = res[k // QUERIES, k % QUERIES]
