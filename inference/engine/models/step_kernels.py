"""A forward of N rows (tokens) through every layer and the head in one numba parallel region.

The rows may belong to different caches at different positions: one decode step (N = 1), a
prefill chunk (N rows of one cache), a lockstep batch (one row per cache) and a verify run
all take this one kernel, and a row's arithmetic does not depend on N or on the other rows.
Every output element of a product is the same integer group dot product (intdot.py) of the
row's own rounded input, and every norm, RoPE, attention and activation runs over one row in
one fixed order. So a row's logits are bitwise the same however it is batched.

Each thread runs ``run_stages``: the same list of stages, claiming work items from shared
counters (worksharing.py) and waiting for each stage to complete before the next. Per layer:

    PREP_QKV  per row: rms_norm(x), rounded per weight format    QKV   tiles of q|k|v rows
    KV        per (row, kv head): k norm, RoPE, f16 cache write of k and v
    ATTEND    per tile of rows x q heads of one kv head (step_attention.py): q norm, RoPE,
              attention over the rows' cache
    PREP_OUT, OUT (x += ..., or into ``proj``), OUT_POST per row: x += rms_norm(proj)
    PREP_FFN, FFN tiles of gate and up rows, SiLU(gate) * up or GELU(gate) * up
    PREP_DOWN, DOWN, FFN_POST

and at the end PREP_HEAD, HEAD for the rows whose logits are wanted. With one row every thread
rounds the input itself (no stage, no wait): cheaper than one more barrier per product.
Weights live in flat arenas, each linear described by a row of an int64 table
(``LINEAR_FIELDS``). The kernel's inputs are named tuples (``StepModel``, ``StepRows``).
"""

from __future__ import annotations

from collections import namedtuple

import numba
import numpy as np

from ..intrinsics import prefetch, uint16_pointer
from ..quants.blocks import (
    BLOCK_Q4_1,
    BLOCK_Q5_0,
    BLOCK_Q8_0,
    block_kind,
    block_offset,
    block_row_bytes,
    dot_pair_q80,
)
from ..quants.intdot import ROW_BLOCK, dot_pair_int, dot_row_int, min_sum
from ..quants.nibbles import dot_pair_nib, dot_row_nib
from ..quants.pair_mins import dot_pair_min
from ..quants.q41 import dot_pair_q41
from ..quants.quantize import round_row, round_row_int
from ..quants.quint import dot_pair_quint, dot_row_quint
from ..stage_calls import Sites
from ..worksharing import claim, claim_end, mark_done, wait_done
from . import prefill_tiles
from .ffn_act import gelu_mul, silu_mul
from .kernels import rope_inplace, store_half
from .rowops import rms_norm_into
from .step_items import TILE_ROWS, item_bounds

# Columns of the linear table: offsets into the arenas (-1: none), shape, format. A float
# matrix (F32/F16/BF16) has SHIFT 0 and Q_OFF into the float arena. NIB: -1 for int8 codes,
# else the weights are packed nibbles (quants/nibbles.py) stored plus this offset. QUINT: -1,
# or where in the q arena a one-row product reads the matrix as the file's blocks, and which
# (quants/blocks.py encode: Q5_0, Q4_1 or Q8_0; a second copy: the tiles read Q_OFF's codes).
Q_OFF, ROWS, COLS, S_OFF, M_OFF, SHIFT, KIND, B_OFF, NIB, QUINT = range(10)
FLOAT_SHIFT = 0
LINEAR_FIELDS = 10
# Linear slots of a layer: q/k/v (or the stacked qkv in slot 0), output, gate/up (or stacked
# gate_up in slot 4), down. Unused slots have ROWS 0.
SLOT_Q, SLOT_OUT, SLOT_GATE, SLOT_UP, SLOT_DOWN = 0, 3, 4, 5, 6
# Stage numbers within a layer.
PREP_QKV, QKV, KV, ATTEND, PREP_OUT, OUT, OUT_POST, PREP_FFN, FFN, PREP_DOWN, DOWN, FFN_POST = range(12)
STAGES_PER_LAYER = 12
# Family switches in dims[FLAGS].
QK_NORM, POST_NORMS, GELU = 1, 2, 4
# dims: the int64 vector of sizes the kernel reads.
N_HEADS, N_KV, HEAD_DIM, N_FF, FLAGS, NEOX = range(6)
# Columns of StepRows.caches: the addresses of a row's cache arrays and their context length.
CACHE_K, CACHE_V, CACHE_CTX = range(3)
PREFETCH_BYTES = 3072
# Q5_0 blocks take more instructions a byte: two threads streaming 151936x896 of them ran at
# 34-39 Gweights/s prefetching 6-12 KB ahead against 22-23 at 3 KB (bench/q5_stream.py).
QUINT_PREFETCH_BYTES = 12288
# A stage's work items: step_items.py (one token row: large at the ends of a matrix, halving
# toward the middle; several: whole tiles, several tiles an item when the rows are few).
SOLO_ROWS = 1  # up to this many rows, each thread rounds every row's input itself
# numba compiles a kernel once per literal constant a call passes it (dot_tile(..., 0, ...,
# False) and dot_tile(..., 1, ..., True) were four variants of it and of the kernels inside):
# the stages pass these typed values, one variant serves every call (a cold start compiles less).
ADD, STORE = np.bool_(True), np.bool_(False)
SLOT0, SLOT1 = np.int64(0), np.int64(1)
COLUMN0 = np.int64(0)  # dot_run's out_at: written from the first column
UPWARD, DOWNWARD = np.bool_(False), np.bool_(True)  # dot_run's backward

StepWeights = namedtuple("StepWeights", ["q", "scales", "mins", "bias", "floats", "gelu"])
StepModel = namedtuple(
    "StepModel",
    ["weights", "linears", "head", "norms", "qk_norms", "output_norm", "layer_info", "dims", "eps", "scale"],
)
# positions (N,); caches (N, 3) int64; cos, sin (N, tables, n_rot/2); head_rows (M,): which
# rows' logits the head computes, in order.
StepRows = namedtuple("StepRows", ["positions", "caches", "cos", "sin", "head_rows"])
# A thread's view of the rounded inputs: each (slots, rows, ...).
Rounded = namedtuple("Rounded", ["values", "ints", "int_scales", "sums"])


@numba.njit(cache=True)
def _dot_tile_one_row(weights, lin, rounded, k, r0, r1, out, accumulate, block, min_block, out_at, backward):
    """One activation row: weight rows two at a time (two independent sums in flight); row r's
    product goes to out[0, out_at + r - r0]. ``backward``: the same pairs, last pair first
    (the thread that takes a stage's items from the back streams downward)."""
    q, scales, mins = weights.q, weights.scales, weights.mins
    cols, shift = lin[COLS], lin[SHIFT]
    groups = cols >> shift
    codes, code_scales, group_sums = rounded.ints[k, 0], rounded.int_scales[k, 0], rounded.sums[k, 0]
    nib, quint, has_mins = lin[NIB], lin[QUINT] >= 0, lin[M_OFF] >= 0
    # The file's blocks (quants/blocks.py: Q5_0, Q4_1 or Q8_0) or the arena's codes.
    kind = block_kind(lin[QUINT]) if quint else -1
    own_bytes = cols if nib < 0 else cols >> 1
    row_bytes = block_row_bytes(kind, cols) if quint else own_bytes
    q_first = block_offset(lin[QUINT]) if quint else lin[Q_OFF]
    ahead = max(1, (QUINT_PREFETCH_BYTES if quint else PREFETCH_BYTES) // row_bytes) * row_bytes
    end = q_first + lin[ROWS] * row_bytes
    has_bias, b_first = lin[B_OFF] >= 0, lin[B_OFF]
    n_pairs = (r1 - r0 + 1) // 2
    for p in range(n_pairs):
        r = r0 + 2 * (n_pairs - 1 - p if backward else p)
        pair = r + 1 < r1
        row_start, s_start = q_first + r * row_bytes, lin[S_OFF] + r * groups
        m_start = lin[M_OFF] + r * groups
        # Prefetch ~3 KB ahead: the hardware prefetcher alone left single-thread reads of short
        # rows at ~12 GB/s, against ~15 with this (measured on 576-4864 column rows).
        # Downward: the rows ``ahead`` below (a matrix's stream in either direction).
        base = row_start - ahead if backward else row_start + ahead
        for i in range(max(base, q_first), min(base + 2 * row_bytes, end), 64):
            prefetch(q, i)
        own_start = lin[Q_OFF] + r * own_bytes  # the row in the arena's codes
        if pair and kind == BLOCK_Q8_0:
            dot_pair_q80(q, row_start, row_start + row_bytes, codes, scales, code_scales, groups, block)
        elif pair and kind == BLOCK_Q4_1:  # scales and mins in the one stream
            dot_pair_q41(
                q, row_start, row_start + row_bytes, codes, scales, code_scales, mins, group_sums, groups,
                block,
            )  # fmt: skip
        elif pair and has_mins:  # the min terms folded into the dot product's loop: same bits
            dot_pair_min(
                q, row_start, row_start + row_bytes, codes, scales, s_start, s_start + groups, code_scales,
                mins, m_start, m_start + groups, group_sums, groups, shift, nib, block,
            )  # fmt: skip
        elif pair and kind == BLOCK_Q5_0:  # Q5_0 as the file packs it: the fewest bytes
            after = row_start + row_bytes
            dot_pair_quint(q, row_start, after, codes, scales, s_start, s_start, code_scales, groups, block)
        elif pair and nib >= 0:
            dot_pair_nib(
                q, row_start, row_start + row_bytes, codes, scales, s_start, s_start + groups, code_scales,
                groups, nib, block,
            )  # fmt: skip
        elif pair:
            dot_pair_int(
                q, row_start, row_start + cols, codes, scales, s_start, s_start + groups, code_scales,
                groups, shift, block,
            )  # fmt: skip
        elif kind == BLOCK_Q5_0:
            block[0] = dot_row_quint(q, row_start, codes, scales, s_start, code_scales, groups)
        elif nib >= 0:  # (a lone Q4_1 or Q8_0 row reads the arena: no one-row block kernel)
            block[0] = dot_row_nib(q, own_start, codes, scales, s_start, code_scales, groups, nib)
        else:
            block[0] = dot_row_int(q, own_start, codes, scales, s_start, code_scales, groups, shift)
        if has_mins and not pair:
            min_block[0] = min_sum(mins, m_start, group_sums, groups)
        for i in range(2 if pair else 1):
            acc = block[i]
            if has_mins and not pair:
                acc += min_block[i]
            if has_bias:
                acc += weights.bias[b_first + r + i]
            if accumulate:
                out[0, out_at + r + i - r0] += acc
            else:
                out[0, out_at + r + i - r0] = acc


@numba.njit(fastmath=True, cache=True)
def _dot_rows_float(weights, lin, values, r0, r1, out, accumulate):
    floats, bias = weights.floats, weights.bias
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
def dot_tile(weights, lin, rounded, k, n_rows, r0, r1, out, accumulate, scratch):
    """out[n, 0 : r1-r0] (+)= rows r0..r1 of linear ``lin`` times row n of slot k's rounded
    input, for n < n_rows: integer group dot products for block formats (intdot.py; several
    rows by register tiles, prefill_tiles.py), float32 for float matrices. ``scratch``
    (1 + TILE_ROWS, ROW_BLOCK): the dot products of a block, then the min terms of a tile."""
    if lin[SHIFT] == FLOAT_SHIFT:
        for n in range(n_rows):
            _dot_rows_float(weights, lin, rounded.values[k, n], r0, r1, out[n], accumulate)
    elif n_rows == 1:
        _dot_tile_one_row(
            weights, lin, rounded, k, r0, r1, out, accumulate, scratch[0], scratch[1], COLUMN0, UPWARD
        )
    else:
        prefill_tiles.dot_tile_many(weights, lin, rounded, k, n_rows, r0, r1, out, accumulate, scratch)


@numba.njit(cache=True)
def dot_run(weights, lin, rounded, k, n_rows, r0, r1, out, out_at, accumulate, scratch, backward):
    """dot_tile into out[:, out_at : out_at + r1 - r0] of a whole C-contiguous ``out``: a
    decode step's products skip the strided view dot_tile writes through (its slicing and
    strided stores cost ~20% of a 32-row item's time, measured on Qwen2.5's head). One row's
    products walk the weight rows downward with ``backward`` (same products, same bits)."""
    if n_rows == 1 and lin[SHIFT] != FLOAT_SHIFT:
        _dot_tile_one_row(
            weights, lin, rounded, k, r0, r1, out, accumulate, scratch[0], scratch[1], out_at, backward
        )
    else:
        view = out[:, out_at : out_at + r1 - r0]
        dot_tile(weights, lin, rounded, k, n_rows, r0, r1, view, accumulate, scratch)


@numba.njit(cache=True)
def round_inputs(linears, x, rounded, n):
    """Round x into row n of every slot in ``linears`` (k, LINEAR_FIELDS) as its weight format
    wants (values, integer codes, their per-group scales, group sums)."""
    for k in range(linears.shape[0]):
        lin = linears[k]
        if lin[ROWS] == 0:
            continue
        cols, shift = lin[COLS], lin[SHIFT]
        values = rounded.values[k, n, :cols]
        if shift == FLOAT_SHIFT:
            round_row(lin[KIND], x, values, rounded.sums[k, n, :0], SLOT1, STORE)  # group 1, no sums
        else:
            n_groups = cols >> shift
            round_row_int(
                lin[KIND], x, values, rounded.ints[k, n, :cols], rounded.int_scales[k, n, :n_groups],
                rounded.sums[k, n, :n_groups], 1 << shift, lin[M_OFF] >= 0,
            )  # fmt: skip


@numba.njit(cache=True, inline="always")  # into prepare_stage: a cold start compiles one level fewer
def _prepare_row(src, norm, eps, linears, rounded, i, normed):
    if norm.shape[0]:
        rms_norm_into(src, norm, eps, normed)
        round_inputs(linears, normed, rounded, i)
    else:
        round_inputs(linears, src, rounded, i)


@numba.njit(cache=True)
def prepare_stage(src, src_rows, norm, eps, linears, rounded, normed, solo, counters, stage):
    """Rounded row i := src[src_rows[i]], rms-normed by ``norm`` first if it has entries. With
    ``solo`` this thread does every row into its own buffers; else rows are shared out."""
    n = src_rows.shape[0]
    if solo:
        for i in range(n):
            _prepare_row(src[src_rows[i]], norm, eps, linears, rounded, i, normed)
        return
    claimed, done = counters
    i = claim(claimed, stage)
    while i < n:
        _prepare_row(src[src_rows[i]], norm, eps, linears, rounded, i, normed)
        mark_done(done, stage)
        i = claim(claimed, stage)
    wait_done(done, stage, n)


@numba.njit(cache=True)
def rows_stage(weights, linears, rounded, n_rows, out, accumulate, counters, stage, tid):
    """Claim tiles of the rows of ``linears`` (stacked one after another in ``out`` (rows,
    total)) and take each tile's products with every one of ``n_rows`` rounded rows. With one
    row the odd threads claim from the back and walk downward (``claim_end``)."""
    claimed, done = counters
    total, n_lin = 0, linears.shape[0]
    for k in range(n_lin):
        total += linears[k, ROWS]
    bounds = item_bounds(total, n_rows, 1)
    n_items = bounds.shape[0] - 1
    back = n_rows == 1 and tid % 2 == 1
    scratch = np.empty((1 + TILE_ROWS, ROW_BLOCK), np.float32)  # (dots | min terms per row, ROW_BLOCK)
    item = claim_end(claimed, stage, n_items, back)
    while item < n_items:
        a, b = bounds[item], bounds[item + 1]
        for j in range(n_lin):
            k = n_lin - 1 - j if back else j
            offset = 0
            for i in range(k):
                offset += linears[i, ROWS]
            lo, hi = max(a, offset), min(b, offset + linears[k, ROWS])
            if lo < hi:
                kernel_call(DOT_RUN_AT, (
                    weights, linears[k], rounded, k, n_rows, lo - offset, hi - offset, out, lo, accumulate,
                    scratch, back,
                ))  # fmt: skip
        mark_done(done, stage)
        item = claim_end(claimed, stage, n_items, back)
    wait_done(done, stage, n_items)


@numba.njit(cache=True)
def cache_arrays(caches, n, n_layers, dims):
    """Row n's cache k and v (layers, kv heads, ctx, head_dim) of f16 bits."""
    shape = (n_layers, dims[N_KV], caches[n, CACHE_CTX], dims[HEAD_DIM])
    k = numba.carray(uint16_pointer(caches[n, CACHE_K]), shape)
    v = numba.carray(uint16_pointer(caches[n, CACHE_V]), shape)
    return k, v


@numba.njit(cache=True)
def kv_stage(qkv, qk_norm, eps, rows, rope, dims, layer, n_layers, counters, stage):
    """Per (row, kv head): norm and rotate k in place, write k and v as f16 at the row's
    position of its cache."""
    claimed, done = counters
    n_heads, n_kv, hd = dims[N_HEADS], dims[N_KV], dims[HEAD_DIM]
    k_first, v_first = n_heads * hd, (n_heads + n_kv) * hd
    n_items = qkv.shape[0] * n_kv
    item = claim(claimed, stage)
    while item < n_items:
        n, h = item // n_kv, item % n_kv
        k = qkv[n, k_first + h * hd : k_first + (h + 1) * hd]
        if dims[FLAGS] & QK_NORM:
            rms_norm_into(k, qk_norm, eps, k)
        rope_inplace(k, rows.cos[n, rope], rows.sin[n, rope], dims[NEOX] != 0)
        cache_k, cache_v = cache_arrays(rows.caches, n, n_layers, dims)
        pos = rows.positions[n]
        store_half(k, cache_k[layer, h, pos])
        store_half(qkv[n, v_first + h * hd : v_first + (h + 1) * hd], cache_v[layer, h, pos])
        mark_done(done, stage)
        item = claim(claimed, stage)
    wait_done(done, stage, n_items)


@numba.njit(cache=True)
def ffn_stage(weights, linears, rounded, n_ff, gelu, act, counters, stage, tid):
    """Tiles of gate and up rows (slot 0 of ``linears`` is gate, or gate|up stacked when slot 1
    is empty) for every row; writes act = SiLU(gate) * up or GELU(gate) * up. With one row the
    odd threads claim from the back and walk downward (``claim_end``)."""
    claimed, done = counters
    n_rows = act.shape[0]
    bounds = item_bounds(n_ff, n_rows, 2)  # gate and up rows: half an item each
    n_items, per_item = bounds.shape[0] - 1, np.max(bounds[1:] - bounds[:-1])
    stacked, back = linears[1, ROWS] == 0, n_rows == 1 and tid % 2 == 1
    scratch = np.empty((1 + TILE_ROWS, ROW_BLOCK), np.float32)  # (dots | min terms per row, ROW_BLOCK)
    tile = np.empty((2, n_rows, per_item), np.float32)  # (gate|up, N, item)
    item = claim_end(claimed, stage, n_items, back)
    while item < n_items:
        a, b = bounds[item], bounds[item + 1]
        gate, up = tile[0], tile[1]  # (N, item) each, the first b - a columns used
        kernel_call(DOT_RUN_AT, (
            weights, linears[0], rounded, SLOT0, n_rows, a, b, gate, COLUMN0, STORE, scratch, back,
        ))  # fmt: skip
        up_lin, up_slot, up_at = (linears[0], SLOT0, n_ff) if stacked else (linears[1], SLOT1, 0)
        kernel_call(DOT_RUN_AT, (
            weights, up_lin, rounded, up_slot, n_rows, up_at + a, up_at + b, up, COLUMN0, STORE, scratch,
            back,
        ))  # fmt: skip
        for n in range(n_rows):
            if gelu:
                gelu_mul(gate[n], up[n], act[n, a:b], weights.gelu)
            else:
                silu_mul(gate[n], up[n], act[n, a:b], max(0, min(b, n_ff - n_ff % 8) - a))
        mark_done(done, stage)
        item = claim_end(claimed, stage, n_items, back)
    wait_done(done, stage, n_items)


@numba.njit(cache=True)
def add_normed_stage(x, proj, weight, eps, counters, stage):
    """Per row: x += rms_norm(proj) * weight (the post-norm residual)."""
    claimed, done = counters
    n = claim(claimed, stage)
    while n < x.shape[0]:
        total = 0.0
        for j in range(proj.shape[1]):
            total += np.float64(proj[n, j] * proj[n, j])
        scale = np.float32(1.0) / np.sqrt(np.float32(total / proj.shape[1]) + eps)
        for j in range(x.shape[1]):
            x[n, j] += (proj[n, j] * scale) * weight[j]
        mark_done(done, stage)
        n = claim(claimed, stage)
    wait_done(done, stage, x.shape[0])


# rows_stage and ffn_stage call dot_run through a pointer (stage_calls.py): compiled once, not
# again inside each; they run after prepare() (fused.FusedForward does it).
KERNEL_SITES = Sites("step_kernels")
DOT_RUN_AT = KERNEL_SITES.add(dot_run)
kernel_call = KERNEL_SITES.call
