"""The attention stage of the fused forward (step_kernels.py): q norm, RoPE and attention of
every (row, q head) over the row's cache.

Work items are tiles of consecutive rows of one cache times the q heads of one kv head
(attention_tile.py: every key and value row read once per tile), or, where a tile would not
fill a vector (a decode step, a lockstep row), single q heads one row at a time
(kernels.attend_head). Both give a row the same bits, so how rows are grouped never shows.
"""

from __future__ import annotations

import numba
import numpy as np

from ..jit.kernel_only import kernel_only
from ..jit.stage_calls import Sites
from ..jit.worksharing import claim, mark_done, wait_done
from .attention_tile import (
    MIN_TILE_QUERIES,
    attend_tile,
    pad_lanes,
    set_lane,
    tile_lanes,
    tile_rows,
    tile_vectors,
)
from .kernels import attend_head, rope_inplace, round_f16_inplace
from .rowops import rms_norm_into
from .step_kernels import CACHE_K, FLAGS, HEAD_DIM, N_HEADS, N_KV, NEOX, QK_NORM, cache_arrays


@kernel_only()
def _prepared_q(qkv, n, h, q_norm, eps, rows, rope, dims, q_buf):
    """q_buf := query head h of row n, normed (if the family norms q), rotated, f16-rounded."""
    hd = dims[HEAD_DIM]
    # Element loops, not slice assignments: numba compiles a slice copy's shape-mismatch error
    # (string formatting, ~2 s of a cold start) though it never raises here.
    for i in range(hd):
        q_buf[i] = qkv[n, h * hd + i]
    if dims[FLAGS] & QK_NORM:
        rms_norm_into(q_buf, q_norm, eps, q_buf)
    rope_inplace(q_buf, rows.cos[n, rope], rows.sin[n, rope], dims[NEOX] != 0)
    round_f16_inplace(q_buf)
    return q_buf


ATTEND_SPLIT = 4  # tiles a run of rows is cut into at least (while each has MIN_TILE_QUERIES)


@numba.njit(cache=True)
def attend_items(caches, group, n_kv):
    """The work items of the attention stage, (items, 3): rows r0..r1 of one cache and a head.
    Runs of rows of one cache are cut into tiles of tile_rows(group) rows, one item per kv
    head; a tile of fewer than MIN_TILE_QUERIES queries (a decode step or a lockstep row of a
    model with few q heads per kv head) is one item per query head instead (head < 0 then: q
    head -1 - head). Either way a row's bits are the same."""
    n = caches.shape[0]
    # A short chunk in ATTEND_SPLIT tiles at least (16 rows of Gemma 3 were one tile: one
    # thread attended while the other waited), none under MIN_TILE_QUERIES queries.
    few = max(-(-MIN_TILE_QUERIES // group), -(-n // ATTEND_SPLIT))
    per_tile = min(tile_rows(group), few)
    items = np.empty((n * group * n_kv, 3), np.int64)  # (most items, r0|r1|head)
    count, r0 = 0, 0
    while r0 < n:
        r1 = r0 + 1
        while r1 < n and r1 - r0 < per_tile and caches[r1, CACHE_K] == caches[r0, CACHE_K]:
            r1 += 1
        tiled = (r1 - r0) * group >= MIN_TILE_QUERIES
        for h in range(n_kv if tiled else n_kv * group):
            items[count, 0], items[count, 1], items[count, 2] = r0, r1, h if tiled else -1 - h
            count += 1
        r0 = r1
    return items[:count]


@numba.njit(cache=True, inline="always")  # into attend_stage: one compile level fewer
def _attend_heads(qkv, q_norm, eps, rows, rope, dims, cache, window, scale, item, q_buf, scores, out):
    """Query head h of rows r0..r1, one row at a time (kernels.attend_head)."""
    hd, h = dims[HEAD_DIM], -1 - item[2]
    keys, values = cache[0][h // (dims[N_HEADS] // dims[N_KV])], cache[1][h // (dims[N_HEADS] // dims[N_KV])]
    for n in range(item[0], item[1]):
        q = _prepared_q(qkv, n, h, q_norm, eps, rows, rope, dims, q_buf)
        attend_call(
            HEAD_AT,
            (q, keys, values, rows.positions[n], window, scale, scores, out[n, h * hd : (h + 1) * hd]),
        )


@numba.njit(cache=True, inline="always")  # into attend_stage: one compile level fewer
def _attend_tile(qkv, q_norm, eps, rows, rope, dims, cache, window, scale, item, q_buf, work, out):
    """The heads of kv head g for rows r0..r1 as one tile (attention_tile.attend_tile)."""
    hd, g, group = dims[HEAD_DIM], item[2], dims[N_HEADS] // dims[N_KV]
    n_queries = (item[1] - item[0]) * group
    lanes = tile_lanes(n_queries)
    n_vecs = tile_vectors(n_queries, lanes)
    q_lanes = np.empty((n_vecs, hd, lanes), np.float32)  # (vecs, hd, lanes)
    first = np.empty((n_vecs, lanes), np.int64)  # (vecs, lanes)
    last = np.empty((n_vecs, lanes), np.int64)  # (vecs, lanes)
    result = np.empty((n_vecs, lanes, hd), np.float32)  # (vecs, lanes, hd)
    for k in range(n_queries):
        n, h = item[0] + k // group, g * group + k % group
        q = _prepared_q(qkv, n, h, q_norm, eps, rows, rope, dims, q_buf)
        set_lane(q_lanes, first, last, k, q, rows.positions[n], window)
    pad_lanes(q_lanes, first, last, n_queries)
    attend_call(TILE_AT, (q_lanes, first, last, cache[0][g], cache[1][g], scale, work, result))
    for k in range(n_queries):
        n, h = item[0] + k // group, g * group + k % group
        for i in range(hd):
            out[n, h * hd + i] = result[k // lanes, k % lanes, i]


@kernel_only()
def attend_stage(
    qkv, q_norm, eps, rows, rope, dims, layer, n_layers, window, scale, q_buf, scores, out, counters, stage
):
    """Attention of every (row, q head): q normed, rotated and f16-rounded, over the row's
    cache up to its position (the last ``window`` only, if > 0). Work items are tiles of rows
    x the q heads of one kv head, or single q heads (attend_items); ``scores`` is this thread's
    scratch of attend_scratch_size elements."""
    claimed, done = counters
    items = attend_items(rows.caches, dims[N_HEADS] // dims[N_KV], dims[N_KV])
    item = claim(claimed, stage)
    while item < items.shape[0]:
        n = items[item, 0]
        k, v = cache_arrays(rows.caches, n, n_layers, dims)
        cache = (k[layer], v[layer])
        if items[item, 2] >= 0:
            _attend_tile(
                qkv, q_norm, eps, rows, rope, dims, cache, window, scale, items[item], q_buf, scores, out
            )
        else:
            _attend_heads(
                qkv, q_norm, eps, rows, rope, dims, cache, window, scale, items[item], q_buf, scores, out
            )
        mark_done(done, stage)
        item = claim(claimed, stage)
    wait_done(done, stage, items.shape[0])


# attend_stage calls the attention kernels through pointers (stage_calls.py): compiled once
# each, and not again inside attend_stage; it runs after prepare().
ATTEND_SITES = Sites("step_attention")
TILE_AT, HEAD_AT = ATTEND_SITES.add(attend_tile), ATTEND_SITES.add(attend_head)
attend_call = ATTEND_SITES.call
