"""The fused forward's products: a stage's weight rows against its rounded token rows.

``rows_stage`` and ``ffn_stage`` (step_region.py's stages) claim work items (step_items.py)
and take each item's products with ``dot_run``, which sends one token row of a block format
to ``dot_one_row`` (two weight rows at a time, from the file's blocks where the table says so:
quants/blocks.py), several rows to ``prefill_tiles.dot_tile_many`` (register tiles) and a
float matrix's rows to ``dot_tile_float``. The stages call dot_run, and dot_run its three
kernels, through function pointers (stage_calls.py): a cold start compiles each once, none
again inside its caller, and the one-row and the tile kernels on different cores
(step_region's compile_elsewhere).
A kernel making pointer calls runs only after stage_calls.prepare (fused.FusedForward).
The table columns and named tuples are step_kernels.py's.
"""

from __future__ import annotations

import numba
import numpy as np

from ..jit.intrinsics import prefetch
from ..jit.kernel_only import kernel_only
from ..jit.stage_calls import Sites
from ..jit.worksharing import claim_end, mark_done, wait_done
from ..quants.blocks import (
    BLOCK_Q4_1,
    BLOCK_Q4_K,
    BLOCK_Q5_0,
    BLOCK_Q6_K,
    BLOCK_Q8_0,
    block_kind,
    block_offset,
    block_row_bytes,
    dot_pair_q80,
)
from ..quants.codes import Q4_1_TAG, Q5_0_TAG, Q8_0_TAG
from ..quants.intdot import ROW_BLOCK, dot_pair_int, dot_row_int, min_sum
from ..quants.kblocks import (
    STRETCH_LINES_Q4K,
    STRETCH_LINES_Q6K,
    dot_pair_q4k,
    dot_pair_q6k,
    dot_quad_q4k,
    dot_quad_q4k_ahead,
    dot_quad_q6k,
    dot_quad_q6k_ahead,
)
from ..quants.nibbles import dot_pair_nib, dot_row_nib
from ..quants.pair_mins import dot_pair_min
from ..quants.q41 import dot_pair_q41
from ..quants.quint import dot_pair_quint, dot_row_quint
from ..quants.tiles import NARROW_W
from . import prefill_tiles
from .ffn_act import gelu_mul, silu_mul
from .step_items import TILE_ROWS, item_bounds
from .step_kernels import (
    B_OFF,
    BLOCKS_ONLY,
    COLS,
    COLUMN0,
    FLOAT_MATRICES,
    FLOAT_SHIFT,
    GELU_FFN,
    M_OFF,
    NIB,
    PREFETCH_BYTES,
    Q_OFF,
    QUINT,
    QUINT_PREFETCH_BYTES,
    ROWS,
    S_OFF,
    SHIFT,
    SLOT0,
    SLOT1,
    STORE,
    STRETCH_BYTES,
    UPWARD,
    StepWeights,
)
from .tile_unpack import group_size, has_mins, unpack_rows

# Item bounds of a stage whose items span one matrix's rows, or gate's and up's (step_items).
ONE_MATRIX, TWO_MATRICES = np.int64(1), np.int64(2)
ROW0 = np.int64(0)  # dot_one_row's token row when there is one
# Up to this many token rows (a lockstep batch of 2, a verify run of 2), a blocks-only matrix's
# products are one-row products per token row, TILE_ROWS weight rows at a time (their blocks
# stay in cache across the token rows). Qwen2.5-Coder-0.5B, a step of 2 / 4 / 8 rows: 34 / 58 /
# 106 ms this way, 52 / 55 / 77 ms through tiles 8 weight rows wide. 3 rows go through the
# narrow tiles (NARROW_W, quants/tiles.py), paired against three one-row passes: Qwen2.5 /
# Gemma 3 1.15x / 1.13x on AVX2, 0.96x / 1.02-1.21x on AVX-512 VNNI; 2 rows were slower.
# Q4_1 blocks, which keep tiles 8 rows wide (prefill_tiles.tile_width), keep one-row products
# up to 3 rows (SmolLM2: tiles 0.90x). K-quant blocks keep them up to a block of rows: the
# tiles would unpack 32 weight rows into scratch codes for as few token rows (Qwen2.5's Q6_K
# down took 5x its decode time for 4 rows), where the one-row kernels read the blocks in
# registers (paired, Qwen2.5 / Gemma 3, 4 rows: 1.14x / 1.09x on AVX-512 VNNI, 0.99x / 0.98x
# on AVX2; 3 rows: 1.13x / 1.07x and 1.13x / 1.06x).
FEW_BLOCK_ROWS = 2
FEW_Q4_1_ROWS = 3
FEW_K_QUANT_ROWS = ROW_BLOCK
# The tiles read Q8_0 and Q4_1 blocks as they are (the codes or nibbles where the int8 copy
# had them, the f16 scale widened in registers), and Q5_0 blocks below this many token rows:
# its fifth bits are merged in registers again for every block of ROW_BLOCK token rows, so
# from here on a tile of weight rows is unpacked once into scratch codes for all of them
# (Qwen2.5-Coder-0.5B against llama.cpp, pp16 / pp64 / pp256: blocks 0.93x / 0.84x / 0.79x,
# unpacked 0.86x / 0.89x / 0.95x).
QUINT_TILE_ROWS = 32


@numba.njit(cache=True)
def _lone_row(weights, lin, rounded, k, n, r, kind, pair_out):
    """Row r's product with token row n, its min term included, as dot_one_row takes a row
    without a partner: Q5_0 from its blocks, the other blocks of a blocks-only matrix as a
    pair of the row with itself (into ``pair_out``), every other format from the arena's codes."""
    q, scales, mins = weights.q, weights.scales, weights.mins
    cols, shift, nib = lin[COLS], lin[SHIFT], lin[NIB]
    groups = cols >> shift
    codes, code_scales, group_sums = rounded.ints[k, n], rounded.int_scales[k, n], rounded.sums[k, n]
    s_start, own_start = lin[S_OFF] + r * groups, lin[Q_OFF] + r * (cols if nib < 0 else cols >> 1)
    if lin[Q_OFF] == BLOCKS_ONLY and kind != BLOCK_Q5_0:
        at = block_offset(lin[QUINT]) + r * block_row_bytes(kind, cols)
        if kind == BLOCK_Q4_K:
            dot_pair_q4k(q, at, at, codes, code_scales, group_sums, cols >> 8, pair_out)
        elif kind == BLOCK_Q6_K:
            dot_pair_q6k(q, at, at, codes, code_scales, group_sums, cols >> 8, pair_out)
        elif kind == BLOCK_Q8_0:
            dot_pair_q80(q, at, at, codes, scales, code_scales, groups, pair_out)
        else:
            dot_pair_q41(q, at, at, codes, scales, code_scales, mins, group_sums, groups, pair_out)
        return pair_out[0]
    if kind == BLOCK_Q5_0:
        row_start = block_offset(lin[QUINT]) + r * block_row_bytes(kind, cols)
        value = dot_row_quint(q, row_start, codes, scales, s_start, code_scales, groups)
    elif nib >= 0:
        value = dot_row_nib(q, own_start, codes, scales, s_start, code_scales, groups, nib)
    else:
        value = dot_row_int(q, own_start, codes, scales, s_start, code_scales, groups, shift)
    if lin[M_OFF] >= 0:
        value += min_sum(mins, lin[M_OFF] + r * groups, group_sums, groups)
    return value


@numba.njit(cache=True, no_cfunc_wrapper=True)
def dot_one_row(weights, lin, rounded, k, n, r0, r1, out, accumulate, block, min_block, out_at, backward):
    """Token row n: weight rows two at a time (two independent sums in flight), four for
    K-quant blocks (two pairs of rows, kblocks.dot_quad_*); row r's product goes to
    out[n, out_at + r - r0]. ``backward``: the same units, last first (the thread that takes
    a stage's items from the back streams downward). ``min_block``: scratch for a lone row."""
    q, scales, mins = weights.q, weights.scales, weights.mins
    cols, shift = lin[COLS], lin[SHIFT]
    groups = cols >> shift
    codes, code_scales, group_sums = rounded.ints[k, n], rounded.int_scales[k, n], rounded.sums[k, n]
    nib, quint, has_mins = lin[NIB], lin[QUINT] >= 0, lin[M_OFF] >= 0
    # The file's blocks (quants/blocks.py: Q5_0, Q4_1, Q8_0, Q4_K or Q6_K) or the arena's codes.
    kind = block_kind(lin[QUINT]) if quint else -1
    own_bytes = cols if nib < 0 else cols >> 1
    row_bytes = block_row_bytes(kind, cols) if quint else own_bytes
    q_first = block_offset(lin[QUINT]) if quint else lin[Q_OFF]
    step = 4 if kind == BLOCK_Q4_K or kind == BLOCK_Q6_K else 2  # rows a unit
    ahead = max(1, (QUINT_PREFETCH_BYTES if quint else PREFETCH_BYTES) // row_bytes)
    if step == 4:  # quads: two units ahead (bench/lab/k_stream.py --far: 12 KB was within a unit)
        ahead = max(ahead, 2 * step)
    ahead *= row_bytes
    end = q_first + lin[ROWS] * row_bytes
    has_bias, b_first = lin[B_OFF] >= 0, lin[B_OFF]
    # A K-quant quad prefetches inside its loop (kblocks_ir.prefetch_share): the stretch of
    # ``far`` bytes ahead, a few lines a super-block, into L2; only the first token row's pass
    # streams (the next rows' find the blocks in cache).
    stream_k = step == 4 and n == 0
    far = max(ahead, STRETCH_BYTES)
    stretch = (cols >> 8) * 64 * (STRETCH_LINES_Q4K if kind == BLOCK_Q4_K else STRETCH_LINES_Q6K)
    last_stretch = max(0, q.shape[0] - stretch)  # (the stretch stays inside q)
    n_units = (r1 - r0 + step - 1) // step
    for p in range(n_units):
        r = r0 + step * (n_units - 1 - p if backward else p)
        m = min(step, r1 - r)  # the unit's rows: a pair (its last alone when odd) or a quad
        pair = m >= 2
        row_start, s_start = q_first + r * row_bytes, lin[S_OFF] + r * groups
        m_start = lin[M_OFF] + r * groups
        after = row_start + row_bytes
        ahead_k = m == 4 and stream_k
        if not ahead_k:
            # Prefetch ~3 KB ahead: the hardware prefetcher alone left single-thread reads of
            # short rows at ~12 GB/s, against ~15 with this (measured on 576-4864 column rows).
            # Downward: the rows ``ahead`` below (a matrix's stream in either direction).
            base = row_start - ahead if backward else row_start + ahead
            for i in range(max(base, q_first), min(base + step * row_bytes, end), 64):
                prefetch(q, i)
        if ahead_k:  # downward: the stretch ``far`` below
            at = min(last_stretch, max(0, row_start - far if backward else row_start + far))
            if kind == BLOCK_Q4_K:
                dot_quad_q4k_ahead(q, row_start, after, codes, code_scales, group_sums, cols >> 8, block, at)
            else:
                dot_quad_q6k_ahead(q, row_start, after, codes, code_scales, group_sums, cols >> 8, block, at)
        elif m == 4 and kind == BLOCK_Q4_K:  # super-blocks of 256, mins inside: two pairs a call
            dot_quad_q4k(q, row_start, after, codes, code_scales, group_sums, cols >> 8, block)
        elif m == 4:
            dot_quad_q6k(q, row_start, after, codes, code_scales, group_sums, cols >> 8, block)
        elif pair and kind == BLOCK_Q4_K:
            dot_pair_q4k(q, row_start, after, codes, code_scales, group_sums, cols >> 8, block)
        elif pair and kind == BLOCK_Q6_K:
            dot_pair_q6k(q, row_start, after, codes, code_scales, group_sums, cols >> 8, block)
        elif pair and kind == BLOCK_Q8_0:
            dot_pair_q80(q, row_start, after, codes, scales, code_scales, groups, block)
        elif pair and kind == BLOCK_Q4_1:  # scales and mins in the one stream
            dot_pair_q41(q, row_start, after, codes, scales, code_scales, mins, group_sums, groups, block)
        elif pair and has_mins:  # the min terms folded into the dot product's loop: same bits
            dot_pair_min(
                q,
                row_start,
                after,
                codes,
                scales,
                s_start,
                s_start + groups,
                code_scales,
                mins,
                m_start,
                m_start + groups,
                group_sums,
                groups,
                shift,
                nib,
                block,
            )
        elif pair and kind == BLOCK_Q5_0:  # Q5_0 as the file packs it: the fewest bytes
            dot_pair_quint(q, row_start, after, codes, scales, s_start, s_start, code_scales, groups, block)
        elif pair and nib >= 0:
            dot_pair_nib(
                q,
                row_start,
                after,
                codes,
                scales,
                s_start,
                s_start + groups,
                code_scales,
                groups,
                nib,
                block,
            )
        elif pair:
            dot_pair_int(
                q,
                row_start,
                row_start + cols,
                codes,
                scales,
                s_start,
                s_start + groups,
                code_scales,
                groups,
                shift,
                block,
            )
        if m % 2 == 1:
            block[m - 1] = _lone_row(weights, lin, rounded, k, n, r + m - 1, kind, min_block)
        for i in range(m):
            acc = block[i]
            if has_bias:
                acc += weights.bias[b_first + r + i]
            if accumulate:
                out[n, out_at + r + i - r0] += acc
            else:
                out[n, out_at + r + i - r0] = acc


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


@kernel_only()
def dot_tile_float(weights, lin, rounded, k, n_rows, r0, r1, out, accumulate, scratch):
    """out[n, 0 : r1-r0] (+)= rows r0..r1 of the float matrix ``lin`` times row n of slot k's
    rounded input (float32 values), for n < n_rows; ``scratch`` unused (the arguments of
    prefill_tiles.dot_tile_many, dot_run's other tile kernel)."""
    for n in range(n_rows):
        _dot_rows_float(weights, lin, rounded.values[k, n], r0, r1, out[n], accumulate)


@kernel_only()
def dot_run(weights, lin, rounded, k, n_rows, r0, r1, out, out_at, accumulate, scratch, backward):
    """The products of rows r0..r1 of ``lin`` into out[:, out_at : out_at + r1 - r0] of a whole
    C-contiguous ``out``: one row of a block format by dot_one_row, which writes ``out``
    itself (the strided view the tiles write through cost ~20% of a 32-row item's time,
    measured on Qwen2.5's head), walking the weight rows downward with ``backward`` (same
    products, same bits); several rows by prefill_tiles.dot_tile_many (of a blocks-only
    matrix: by dot_one_row per token row while one_row_products, else on tiles unpacked into
    scratch), a float matrix by dot_tile_float. All through pointers (module docstring): no
    level between dot_run and the tiles whose compile would optimize the tile kernels' code
    once more."""
    if lin[SHIFT] == FLOAT_SHIFT:
        view = out[:, out_at : out_at + r1 - r0]
        product_call(FLOAT_AT, (weights, lin, rounded, k, n_rows, r0, r1, view, accumulate, scratch))
    elif n_rows == 1:
        product_call(
            ONE_ROW_AT,
            (
                weights,
                lin,
                rounded,
                k,
                ROW0,
                r0,
                r1,
                out,
                accumulate,
                scratch[0],
                scratch[1],
                out_at,
                backward,
            ),
        )
    elif lin[Q_OFF] == BLOCKS_ONLY and one_row_products(kind_of(lin), n_rows):
        for a in range(r0, r1, TILE_ROWS):
            b = min(r1, a + TILE_ROWS)
            at = out_at + a - r0
            for n in range(n_rows):
                row_args = (
                    weights,
                    lin,
                    rounded,
                    k,
                    n,
                    a,
                    b,
                    out,
                    accumulate,
                    scratch[0],
                    scratch[1],
                    at,
                    UPWARD,
                )
                product_call(ONE_ROW_AT, row_args)
    elif lin[Q_OFF] == BLOCKS_ONLY and tile_reads(kind_of(lin), n_rows):
        # Whole tiles straight from the blocks (prefill_tiles reads them as it reads codes);
        # the rows past them unpacked.
        width = prefill_tiles.tile_width(n_rows, tile_marker(kind_of(lin)))  # as _tiles picks it
        whole = r0 + (r1 - r0) // width * width
        tile_lin = lin.copy()
        tile_lin[Q_OFF] = block_offset(lin[QUINT])
        tile_lin[NIB] = tile_marker(kind_of(lin))
        if whole > r0:
            view = out[:, out_at : out_at + whole - r0]
            _tiles(weights, tile_lin, rounded, k, n_rows, r0, whole, view, accumulate, scratch)
        if r1 > whole:
            rest = out[:, out_at + whole - r0 : out_at + r1 - r0]
            _unpacked_tiles(weights, lin, rounded, k, n_rows, whole, r1, rest, accumulate, scratch)
    elif lin[Q_OFF] == BLOCKS_ONLY:
        _unpacked_tiles(
            weights, lin, rounded, k, n_rows, r0, r1, out[:, out_at : out_at + r1 - r0], accumulate, scratch
        )
    else:
        _tiles(
            weights, lin, rounded, k, n_rows, r0, r1, out[:, out_at : out_at + r1 - r0], accumulate, scratch
        )


@kernel_only()
def _tiles(weights, lin, rounded, k, n_rows, r0, r1, view, accumulate, scratch):
    """prefill_tiles' product of ``n_rows`` token rows with rows r0..r1 of ``lin`` into
    ``view``, through tiles as wide as tile_width says (each width its own kernel)."""
    args = (weights, lin, rounded, k, n_rows, r0, r1, view, accumulate, scratch)
    if prefill_tiles.tile_width(n_rows, lin[NIB]) == NARROW_W:
        product_call(NARROW_TILE_AT, args)
    else:
        product_call(TILE_AT, args)


@numba.njit(cache=True)
def one_row_products(kind, n_rows):
    """Whether a blocks-only matrix of ``kind`` takes the products of ``n_rows`` token rows one
    token row at a time (FEW_BLOCK_ROWS) rather than through the tiles."""
    if kind == BLOCK_Q4_K or kind == BLOCK_Q6_K:
        return n_rows <= FEW_K_QUANT_ROWS
    return n_rows <= (FEW_Q4_1_ROWS if kind == BLOCK_Q4_1 else FEW_BLOCK_ROWS)


@numba.njit(cache=True)
def tile_reads(kind, n_rows):
    """Whether the tiles read blocks of ``kind`` as they are (quants/tiles.py) for a product
    of ``n_rows`` token rows, or take them unpacked."""
    if kind == BLOCK_Q5_0:
        return n_rows < QUINT_TILE_ROWS
    return kind == BLOCK_Q8_0 or kind == BLOCK_Q4_1


@numba.njit(cache=True)
def tile_marker(kind):
    """The tiles' layout tag (codes.py) of the blocks of ``kind`` they read (tile_reads)."""
    if kind == BLOCK_Q5_0:
        return Q5_0_TAG
    return Q8_0_TAG if kind == BLOCK_Q8_0 else Q4_1_TAG


@numba.njit(cache=True)
def kind_of(lin):
    """The block kind of a linear's table row with blocks (QUINT >= 0)."""
    return block_kind(lin[QUINT])


@kernel_only()
def _unpacked_tiles(weights, lin, rounded, k, n_rows, r0, r1, view, accumulate, scratch):
    """view[:, 0 : r1 - r0] (+)= rows r0..r1 of the blocks-only ``lin`` with n_rows token rows:
    TILE_ROWS weight rows at a time unpacked into int8 codes and scales (tile_unpack.py), then
    prefill_tiles.dot_tile_many over them as over the arena's codes."""
    cols, kind = lin[COLS], block_kind(lin[QUINT])
    groups, row_bytes = cols // group_size(kind), block_row_bytes(kind, cols)
    mins_too = has_mins(kind)
    codes = np.empty(TILE_ROWS * cols, np.int8)  # (tile rows * cols,)
    scales = np.empty(TILE_ROWS * groups, np.float32)  # (tile rows * groups,)
    mins = np.empty(TILE_ROWS * groups if mins_too else 1, np.float32)  # (tile rows * groups,)
    tile = StepWeights(codes, scales, mins, weights.bias, weights.floats, weights.gelu)
    tile_lin = lin.copy()
    tile_lin[Q_OFF], tile_lin[S_OFF], tile_lin[NIB], tile_lin[QUINT] = 0, 0, -1, -1
    tile_lin[M_OFF] = 0 if mins_too else -1
    for a in range(r0, r1, TILE_ROWS):
        b = min(r1, a + TILE_ROWS)
        unpack_rows(
            weights.q, block_offset(lin[QUINT]) + a * row_bytes, kind, cols, b - a, codes, scales, mins
        )
        tile_lin[ROWS] = b - a
        tile_lin[B_OFF] = lin[B_OFF] + a if lin[B_OFF] >= 0 else -1
        part = view[:, a - r0 : b - r0]
        _tiles(tile, tile_lin, rounded, k, n_rows, ROW0, b - a, part, accumulate, scratch)


@numba.njit(cache=True, no_cfunc_wrapper=True)
def rows_stage(weights, linears, rounded, n_rows, out, accumulate, counters, stage, tid):
    """Claim tiles of the rows of ``linears`` (stacked one after another in ``out`` (rows,
    total)) and take each tile's products with every one of ``n_rows`` rounded rows. With one
    row the odd threads claim from the back and walk downward (``claim_end``)."""
    claimed, done = counters
    total, n_lin = np.int64(0), linears.shape[0]  # np.int64: not a literal 0 (a second item_bounds)
    for k in range(n_lin):
        total += linears[k, ROWS]
    bounds = item_bounds(total, n_rows, ONE_MATRIX)
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
                kernel_call(
                    DOT_RUN_AT,
                    (
                        weights,
                        linears[k],
                        rounded,
                        k,
                        n_rows,
                        lo - offset,
                        hi - offset,
                        out,
                        lo,
                        accumulate,
                        scratch,
                        back,
                    ),
                )
        mark_done(done, stage)
        item = claim_end(claimed, stage, n_items, back)
    wait_done(done, stage, n_items)


@numba.njit(cache=True, no_cfunc_wrapper=True)
def ffn_stage(weights, linears, rounded, n_ff, gelu, act, counters, stage, tid):
    """Tiles of gate and up rows (slot 0 of ``linears`` is gate, or gate|up stacked when slot 1
    is empty) for every row; writes act = SiLU(gate) * up or GELU(gate) * up. With one row the
    odd threads claim from the back and walk downward (``claim_end``)."""
    claimed, done = counters
    n_rows = act.shape[0]
    bounds = item_bounds(n_ff, n_rows, TWO_MATRICES)  # gate and up rows: half an item each
    n_items = bounds.shape[0] - 1
    per_item = max(bounds[1] - bounds[0], bounds[-1] - bounds[-2])  # the largest items: at the ends
    stacked, back = linears[1, ROWS] == 0, n_rows == 1 and tid % 2 == 1
    scratch = np.empty((1 + TILE_ROWS, ROW_BLOCK), np.float32)  # (dots | min terms per row, ROW_BLOCK)
    tile = np.empty((2, n_rows, per_item), np.float32)  # (gate|up, N, item)
    item = claim_end(claimed, stage, n_items, back)
    while item < n_items:
        a, b = bounds[item], bounds[item + 1]
        gate, up = tile[0], tile[1]  # (N, item) each, the first b - a columns used
        kernel_call(
            DOT_RUN_AT,
            (
                weights,
                linears[0],
                rounded,
                SLOT0,
                n_rows,
                a,
                b,
                gate,
                COLUMN0,
                STORE,
                scratch,
                back,
            ),
        )
        up_lin, up_slot, up_at = (linears[0], SLOT0, n_ff) if stacked else (linears[1], SLOT1, 0)
        kernel_call(
            DOT_RUN_AT,
            (
                weights,
                up_lin,
                rounded,
                up_slot,
                n_rows,
                up_at + a,
                up_at + b,
                up,
                COLUMN0,
                STORE,
                scratch,
                back,
            ),
        )
        for n in range(n_rows):
            if gelu:  # through a pointer: compiled only for a model with GELU
                kernel_call(GELU_AT, (gate[n], up[n], act[n, a:b], weights.gelu))
            else:
                silu_mul(gate[n], up[n], act[n, a:b], max(0, min(b, n_ff - n_ff % 8) - a))
        mark_done(done, stage)
        item = claim_end(claimed, stage, n_items, back)
    wait_done(done, stage, n_items)


# dot_run calls its two kernels, and the stages dot_run, through pointers (stage_calls.py).
PRODUCT_SITES = Sites("step_products")
ONE_ROW_AT = PRODUCT_SITES.add(dot_one_row)
TILE_AT = PRODUCT_SITES.add(prefill_tiles.dot_tile_many)
NARROW_TILE_AT = PRODUCT_SITES.add(prefill_tiles.dot_tile_narrow)
FLOAT_AT = PRODUCT_SITES.add(dot_tile_float, needs=FLOAT_MATRICES)
product_call = PRODUCT_SITES.call
KERNEL_SITES = Sites("step_kernels")
DOT_RUN_AT = KERNEL_SITES.add(dot_run, PRODUCT_SITES)
GELU_AT = KERNEL_SITES.add(gelu_mul, needs=GELU_FFN)
kernel_call = KERNEL_SITES.call
