"""A whole decode step (every layer and the output head) in one numba parallel region.

Each thread runs ``run_stages``: the same list of stages, claiming work items of each from
shared counters (see worksharing.py) and waiting for the stage to complete before the next.
Per layer:

    QKV      rows of the q|k|v products           (input: rms_norm(x), rounded per weight format)
    KV       per kv head: k norm, RoPE, f16 cache write of k and v
    ATTEND   per q head: q norm, RoPE, attention over the cache
    OUT      rows of the output product            (x += ..., or into ``proj`` with post norms)
    OUT_POST one item: x += rms_norm(proj)          (post-norm families only)
    FFN      rows of gate and up, then SiLU(gate) * up or GELU(gate) * up
    DOWN     rows of the down product               (x += ..., or into ``proj``)
    FFN_POST one item: x += rms_norm(proj)

and at the end HEAD: rows of the output matrix on rms_norm(x). Inputs that every item of a stage
reads (the normed and rounded row) are computed by each thread for itself: cheaper than one
more stage. Weights live in flat arenas, each linear described by a row of an int64 table
(``LINEAR_FIELDS``), so one call takes a handful of arrays instead of hundreds.

Arithmetic is the per-linear kernels' (matvec.py) and the numpy layers' rounding (f16 q, cache
rows and probabilities; ggml's activation rounding), so models' numpy ``block`` stays the
reference the tests compare against.
"""

from __future__ import annotations

import numba
import numpy as np

from ..quants.intdot import add_min_terms, dot_row_int
from ..quants.quantize import round_row, round_row_int
from ..intrinsics import prefetch
from ..worksharing import claim, mark_done, wait_done
from .kernels import rope_inplace, round_f16_inplace, scores_into, softmax_f16_inplace, weighted_values
from ..layers import silu_one
from .rowops import gelu_lookup, rms_norm_into

# Columns of the linear table: offsets into the arenas (-1: none), shape, format. A float
# matrix (F32/F16/BF16) has SHIFT 0 and Q_OFF into the float arena.
Q_OFF, ROWS, COLS, S_OFF, M_OFF, SHIFT, KIND, B_OFF = range(8)
FLOAT_SHIFT = 0
LINEAR_FIELDS = 8
# Linear slots of a layer: q/k/v (or the stacked qkv in slot 0), output, gate/up (or stacked
# gate_up in slot 4), down. Unused slots have ROWS 0.
SLOT_Q, SLOT_OUT, SLOT_GATE, SLOT_UP, SLOT_DOWN = 0, 3, 4, 5, 6
# Stage numbers within a layer.
QKV, KV, ATTEND, OUT, OUT_POST, FFN, DOWN, FFN_POST = range(8)
STAGES_PER_LAYER = 8
# Family switches in dims[FLAGS].
QK_NORM, POST_NORMS, GELU = 1, 2, 4
# dims: the int64 vector of sizes the kernel reads.
N_HEADS, N_KV, HEAD_DIM, N_FF, FLAGS, NEOX = range(6)
PREFETCH_BYTES = 3072
TILE_ROWS = 32  # rows per work item: ~18-150 KB of weights, far above the cost of a claim


@numba.njit(fastmath=True, cache=True)
def _dot_rows_grouped(weights, lin, inputs, k, r0, r1, out, accumulate):
    q, scales, mins, bias = weights[0], weights[1], weights[2], weights[3]
    _, ints, int_scales, sums = inputs
    cols, shift = lin[COLS], lin[SHIFT]
    groups = cols >> shift
    codes, code_scales, group_sums = ints[k], int_scales[k], sums[k]
    # Prefetch ~3 KB ahead: the hardware prefetcher alone left single-thread reads of short
    # rows at ~12 GB/s, against ~15 with this (measured on 576-4864 column rows).
    ahead = max(1, PREFETCH_BYTES // cols) * cols
    end = lin[Q_OFF] + lin[ROWS] * cols
    for r in range(r0, r1):
        row_start = lin[Q_OFF] + r * cols
        for i in range(row_start + ahead, min(row_start + ahead + cols, end), 64):
            prefetch(q, i)
        acc = dot_row_int(q, row_start, codes, scales, lin[S_OFF] + r * groups, code_scales, groups, shift)
        if lin[M_OFF] >= 0:
            acc = add_min_terms(acc, mins, lin[M_OFF] + r * groups, group_sums, groups)
        if lin[B_OFF] >= 0:
            acc += bias[lin[B_OFF] + r]
        if accumulate:
            out[r - r0] += acc
        else:
            out[r - r0] = acc


@numba.njit(fastmath=True, cache=True)
def _dot_rows_float(weights, lin, values, r0, r1, out, accumulate):
    floats, bias = weights[4], weights[3]
    cols = lin[COLS]
    for r in range(r0, r1):
        # A row view indexed from 0: an index computed from an offset gets numba's
        # negative-index wraparound, which stops LLVM vectorizing (~10x slower).
        w_row = floats[lin[Q_OFF] + r * cols : lin[Q_OFF] + (r + 1) * cols]
        acc = np.float32(0.0)
        for j in range(cols):
            acc += w_row[j] * values[j]
        if lin[B_OFF] >= 0:
            acc += bias[lin[B_OFF] + r]
        if accumulate:
            out[r - r0] += acc
        else:
            out[r - r0] = acc


@numba.njit(cache=True)
def dot_rows(weights, lin, inputs, k, r0, r1, out, accumulate):
    """out[0 : r1-r0] (+)= rows r0..r1 of linear ``lin`` times slot k's rounded input: integer
    group dot products for block formats (intdot.py), float32 for float matrices."""
    if lin[SHIFT] == FLOAT_SHIFT:
        _dot_rows_float(weights, lin, inputs[0][k], r0, r1, out, accumulate)
    else:
        _dot_rows_grouped(weights, lin, inputs, k, r0, r1, out, accumulate)


@numba.njit(cache=True)
def round_inputs(linears, x, inputs):
    """Round x once per slot in ``linears`` (k, LINEAR_FIELDS) as its weight format wants:
    inputs = (values, integer codes, their per-group scales, group sums), each (slots, ...)."""
    values, ints, int_scales, sums = inputs
    for k in range(linears.shape[0]):
        lin = linears[k]
        if lin[ROWS] == 0:
            continue
        cols, shift = lin[COLS], lin[SHIFT]
        if shift == FLOAT_SHIFT:
            round_row(lin[KIND], x, values[k, :cols], sums[k, :0], 1, False)
        else:
            n_groups = cols >> shift
            round_row_int(
                lin[KIND], x, values[k, :cols], ints[k, :cols], int_scales[k, :n_groups], sums[k, :n_groups],
                1 << shift, lin[M_OFF] >= 0,
            )  # fmt: skip


@numba.njit(cache=True)
def rows_stage(weights, linears, inputs, out, accumulate, counters, stage):
    """Claim tiles of the rows of ``linears`` (stacked one after another in ``out``) until
    none are left, then wait for the stage to complete."""
    claimed, done = counters
    total = 0
    for k in range(linears.shape[0]):
        total += linears[k, ROWS]
    n_items = (total + TILE_ROWS - 1) // TILE_ROWS
    item = claim(claimed, stage)
    while item < n_items:
        a, b = item * TILE_ROWS, min(total, (item + 1) * TILE_ROWS)
        offset = 0
        for k in range(linears.shape[0]):
            lo, hi = max(a, offset), min(b, offset + linears[k, ROWS])
            if lo < hi:
                dot_rows(weights, linears[k], inputs, k, lo - offset, hi - offset, out[lo:hi], accumulate)
            offset += linears[k, ROWS]
        mark_done(done, stage)
        item = claim(claimed, stage)
    wait_done(done, stage, n_items)


@numba.njit(cache=True)
def kv_stage(qkv, qk_norm, eps, cos, sin, dims, cache_k, cache_v, pos, counters, stage):
    """Per kv head: norm and rotate k in place, write k and v at row ``pos`` of the cache."""
    claimed, done = counters
    n_heads, n_kv, hd = dims[N_HEADS], dims[N_KV], dims[HEAD_DIM]
    k_first, v_first = n_heads * hd, (n_heads + n_kv) * hd
    h = claim(claimed, stage)
    while h < n_kv:
        k = qkv[k_first + h * hd : k_first + (h + 1) * hd]
        if dims[FLAGS] & QK_NORM:
            rms_norm_into(k, qk_norm, eps, k)
        rope_inplace(k, cos, sin, dims[NEOX] != 0)
        cache_k[h, pos] = k
        cache_v[h, pos] = qkv[v_first + h * hd : v_first + (h + 1) * hd]
        round_f16_inplace(cache_k[h, pos])
        round_f16_inplace(cache_v[h, pos])
        mark_done(done, stage)
        h = claim(claimed, stage)
    wait_done(done, stage, n_kv)


@numba.njit(cache=True)
def attend_stage(qkv, q_norm, eps, cos, sin, dims, cache_k, cache_v, pos, window, scale, q_buf, scores, out, counters, stage):
    """Per q head: norm, rotate and f16-round q, attend over cache rows up to ``pos`` (the last
    ``window`` only, if > 0) and write the head's output."""
    claimed, done = counters
    n_heads, hd = dims[N_HEADS], dims[HEAD_DIM]
    group = n_heads // dims[N_KV]
    first = max(0, pos + 1 - window) if window > 0 else 0
    n_keys = pos + 1 - first
    h = claim(claimed, stage)
    while h < n_heads:
        q_buf[:] = qkv[h * hd : (h + 1) * hd]
        if dims[FLAGS] & QK_NORM:
            rms_norm_into(q_buf, q_norm, eps, q_buf)
        rope_inplace(q_buf, cos, sin, dims[NEOX] != 0)
        round_f16_inplace(q_buf)
        probs = scores[:n_keys]
        scores_into(q_buf, cache_k[h // group], first, pos + 1, scale, probs)
        softmax_f16_inplace(probs)
        weighted_values(probs, cache_v[h // group], first, out[h * hd : (h + 1) * hd])
        mark_done(done, stage)
        h = claim(claimed, stage)
    wait_done(done, stage, n_heads)


@numba.njit(cache=True)
def ffn_stage(weights, linears, inputs, n_ff, gelu, tile, act, counters, stage):
    """Tiles of gate and up rows (slot 0 of ``linears`` is gate, or gate|up stacked when slot 1
    is empty); writes act = SiLU(gate) * up or GELU(gate) * up."""
    claimed, done = counters
    n_items = (n_ff + TILE_ROWS - 1) // TILE_ROWS
    stacked = linears[1, ROWS] == 0
    item = claim(claimed, stage)
    while item < n_items:
        a, b = item * TILE_ROWS, min(n_ff, (item + 1) * TILE_ROWS)
        gate, up = tile[0, : b - a], tile[1, : b - a]
        dot_rows(weights, linears[0], inputs, 0, a, b, gate, False)
        if stacked:
            dot_rows(weights, linears[0], inputs, 0, n_ff + a, n_ff + b, up, False)
        else:
            dot_rows(weights, linears[1], inputs, 1, a, b, up, False)
        if gelu:
            gate_bits, table = gate.view(np.uint32), weights[5]
            for i in range(b - a):
                act[a + i] = gelu_lookup(gate[i], gate_bits[i], table) * up[i]
        else:
            for i in range(b - a):
                act[a + i] = silu_one(gate[i]) * up[i]
        mark_done(done, stage)
        item = claim(claimed, stage)
    wait_done(done, stage, n_items)


@numba.njit(cache=True)
def add_normed_stage(x, proj, weight, eps, counters, stage):
    """One item: x += rms_norm(proj) * weight (the post-norm residual)."""
    claimed, done = counters
    if claim(claimed, stage) == 0:
        total = 0.0
        for j in range(proj.shape[0]):
            total += np.float64(proj[j] * proj[j])
        scale = np.float32(1.0) / np.sqrt(np.float32(total / proj.shape[0]) + eps)
        for j in range(x.shape[0]):
            x[j] += (proj[j] * scale) * weight[j]
        mark_done(done, stage)
    wait_done(done, stage, 1)


@numba.njit(cache=True)
def run_stages(tid, x, model, cos, sin, cache_k, cache_v, pos, buffers, logits, counters):
    """Every stage of one decode step, as thread ``tid`` of the region sees it."""
    weights, linears, head, norms, qk_norms, output_norm, layer_info, dims, eps, scale = model
    qkv, attn, act, proj, normed, values, ints, int_scales, sums, q_buf, scores, tile = buffers
    h, rounded = normed[tid], (values[tid], ints[tid], int_scales[tid], sums[tid])
    post, gelu = dims[FLAGS] & POST_NORMS, dims[FLAGS] & GELU
    for layer in range(linears.shape[0]):
        lin, stage = linears[layer], layer * STAGES_PER_LAYER
        window, rope = layer_info[layer, 0], layer_info[layer, 1]
        rms_norm_into(x, norms[layer, 0], eps, h)
        round_inputs(lin[SLOT_Q:SLOT_OUT], h, rounded)
        rows_stage(weights, lin[SLOT_Q:SLOT_OUT], rounded, qkv, False, counters, stage + QKV)
        kv_stage(
            qkv, qk_norms[layer, 1], eps, cos[rope], sin[rope], dims, cache_k[layer], cache_v[layer], pos,
            counters, stage + KV,
        )  # fmt: skip
        attend_stage(
            qkv, qk_norms[layer, 0], eps, cos[rope], sin[rope], dims, cache_k[layer], cache_v[layer], pos,
            window, scale, q_buf[tid], scores[tid], attn, counters, stage + ATTEND,
        )  # fmt: skip
        round_inputs(lin[SLOT_OUT:SLOT_GATE], attn, rounded)
        if post:
            rows_stage(weights, lin[SLOT_OUT:SLOT_GATE], rounded, proj, False, counters, stage + OUT)
            add_normed_stage(x, proj, norms[layer, 1], eps, counters, stage + OUT_POST)
        else:
            rows_stage(weights, lin[SLOT_OUT:SLOT_GATE], rounded, x, True, counters, stage + OUT)
        rms_norm_into(x, norms[layer, 2], eps, h)
        round_inputs(lin[SLOT_GATE:SLOT_DOWN], h, rounded)
        ffn_stage(weights, lin[SLOT_GATE:SLOT_DOWN], rounded, dims[N_FF], gelu, tile[tid], act, counters, stage + FFN)
        round_inputs(lin[SLOT_DOWN:], act, rounded)
        if post:
            rows_stage(weights, lin[SLOT_DOWN:], rounded, proj, False, counters, stage + DOWN)
            add_normed_stage(x, proj, norms[layer, 3], eps, counters, stage + FFN_POST)
        else:
            rows_stage(weights, lin[SLOT_DOWN:], rounded, x, True, counters, stage + DOWN)
    if head[0, ROWS] > 0:
        rms_norm_into(x, output_norm, eps, h)
        round_inputs(head, h, rounded)
        rows_stage(weights, head, rounded, logits, False, counters, linears.shape[0] * STAGES_PER_LAYER)


@numba.njit(parallel=True, cache=True)
def _all_threads(n_threads, x, model, cos, sin, cache_k, cache_v, pos, buffers, logits, counters):
    # A parallel loop's body may only capture arrays and scalars, not tuples of arrays: unpack
    # here, repack per thread.
    (q, scales, mins, bias, floats, gelu), linears, head, norms, qk_norms, output_norm, layer_info, dims, eps, scale = (
        model
    )
    qkv, attn, act, proj, normed, values, ints, int_scales, sums, q_buf, scores, tile = buffers
    claimed, done = counters
    for tid in numba.prange(n_threads):
        run_stages(
            tid, x,
            ((q, scales, mins, bias, floats, gelu), linears, head, norms, qk_norms, output_norm, layer_info, dims, eps, scale),
            cos, sin, cache_k, cache_v, pos,
            (qkv, attn, act, proj, normed, values, ints, int_scales, sums, q_buf, scores, tile),
            logits, (claimed, done),
        )  # fmt: skip


@numba.njit(cache=True)
def decode_step(n_threads, x, model, cos, sin, cache_k, cache_v, pos, logits):
    """One token through every layer: x (n_embd,) is updated in place, the cache gets row
    ``pos`` of every layer, and when the model's head is in the table, logits (vocab,) are
    written. cos, sin: (n_rope_tables, n_rot/2) of this position; ``model`` is the tuple
    fused.DecodeStep builds. Runs as one parallel region of ``n_threads`` threads."""
    linears, head, dims = model[1], model[2], model[7]
    n_heads, hd, n_embd = dims[N_HEADS], dims[HEAD_DIM], x.shape[0]
    max_cols = max(linears[:, :, COLS].max(), head[0, COLS])
    n_stages = (linears.shape[0] + 1) * STAGES_PER_LAYER
    buffers = (
        np.empty((n_heads + 2 * dims[N_KV]) * hd, np.float32),  # (q|k|v,)
        np.empty(n_heads * hd, np.float32),  # (heads * hd,) attention output
        np.empty(dims[N_FF], np.float32),  # (n_ff,) activated gate * up
        np.empty(n_embd, np.float32),  # (n_embd,) a product before its post norm
        np.empty((n_threads, n_embd), np.float32),  # (threads, n_embd) normed x
        np.empty((n_threads, 3, max_cols), np.float32),  # (threads, slots, cols) rounded inputs
        np.zeros((n_threads, 3, max_cols), np.int16),  # (threads, slots, cols) their integer codes
        np.zeros((n_threads, 3, max_cols // 16), np.float32),  # (threads, slots, groups) code scales
        np.zeros((n_threads, 3, max_cols // 16), np.float32),  # (threads, slots, groups) group sums
        np.empty((n_threads, hd), np.float32),  # (threads, hd) one q head
        np.empty((n_threads, pos + 1), np.float32),  # (threads, keys) scores, then probabilities
        np.empty((n_threads, 2, TILE_ROWS), np.float32),  # (threads, gate|up, tile)
    )
    counters = (np.zeros(n_stages, np.int64), np.zeros(n_stages, np.int64))  # claimed, done per stage
    _all_threads(n_threads, x, model, cos, sin, cache_k, cache_v, pos, buffers, logits, counters)
