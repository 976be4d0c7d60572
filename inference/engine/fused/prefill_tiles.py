"""The fused forward's product of a tile of weight rows with several activation rows (prefill
chunks, lockstep batches, verify runs), through the register tiles of quants/tiles.py.

Each output element is the one-row kernel's value (tiles.py), plus the row's min term (the
same in-order chain intdot.min_sum computes) and bias, added in the order the one-row path
adds them: a row's result does not depend on how many rows run with it.
"""

from __future__ import annotations

import numba
import numpy as np

from ..jit.intrinsics import fma32, prefetch
from ..jit.kernel_only import kernel_only
from ..quants.codes import Q4_1_TAG, Q5_0_TAG, Q8_0_TAG, Q41_BLOCK, Q80_BLOCK, QUINT_BLOCK
from ..quants.intdot import ROW_BLOCK, dot_rows_int
from ..quants.nibbles import dot_rows_nib
from ..quants.tiles import NARROW_W, TILE_W, dot_tile_rows
from . import step_kernels as sk  # a module object: step_kernels imports this module too
from .tile_unpack import half_at

# Blocks of ROW_BLOCK activation rows a weight tile takes while it sits in L1: 16 rows (a
# 16-token prefill in one pass, its weights streamed once with their prefetch spread over four
# blocks), at most 16 x 4864 bytes of codes (L2).
PASS_BLOCKS = 4


@numba.njit(cache=True)
def tile_width(n_rows, nib):
    """Weight rows a register tile takes in a product of ``n_rows`` token rows of weights in
    layout ``nib``: NARROW_W when the rows fit one block of ROW_BLOCK (quants/tiles.py says
    why), but TILE_W for Q4_1 blocks, whose 4-row step the narrow tiles made slower (SmolLM2,
    paired: 0.90-0.94x; TILE_W 1.04-1.09x where the other formats took NARROW_W)."""
    return NARROW_W if n_rows <= ROW_BLOCK and nib != Q4_1_TAG else TILE_W


@numba.njit(cache=True)
def tile_row_bytes(cols, nib):
    """Bytes of a weight row as the tiles read it (``nib``, a layout's tag: codes.py): int8
    codes (-1), the file's Q5_0, Q8_0 or Q4_1 blocks (whole tiles only, no _rest_rows), or
    packed nibbles."""
    if nib < 0:
        return cols
    if nib == Q4_1_TAG:
        return cols // 32 * Q41_BLOCK
    if nib == Q5_0_TAG:
        return cols // 32 * QUINT_BLOCK
    if nib == Q8_0_TAG:
        return cols // 32 * Q80_BLOCK
    return cols >> 1


@kernel_only()
def _finish(block, min_tile, has_mins, bias, has_bias, out, accumulate):
    """out (+)= block (+ min terms) (+ bias), per element in the one-row path's order of adds;
    rows of ``out`` as many as it has (the block's padding rows are dropped)."""
    for i in range(out.shape[0]):
        values, dst, terms = block[i], out[i], min_tile[i]
        for c in range(values.shape[0]):
            acc = values[c]
            if has_mins:
                acc += terms[c]
            if has_bias:
                acc += bias[c]
            if accumulate:
                dst[c] += acc
            else:
                dst[c] = acc


@numba.njit(cache=True)
def _prefetch_rows(q, start, stop, end):
    for i in range(start, min(stop, end), 64):
        prefetch(q, i)


@numba.njit(cache=True)
def _prefetch_codes(codes, first, stop, cols):
    """Ask for activation rows first..stop of ``codes`` (the next block's): a tile's weight
    rows sit in L1, the activation rows of the whole chunk do not."""
    for n in range(first, stop):
        row = codes[n]
        for j in range(0, cols, 64):
            prefetch(row, j)


@kernel_only()
def transpose_mins(mins, m_first, n_weight_rows, n_groups, out):
    """out[g, r] = mins[m_first + r * n_groups + g] for r < n_weight_rows: a tile's mins
    group-major, so that each group's min terms advance as one vector over the rows."""
    for r in range(n_weight_rows):
        for g in range(n_groups):
            out[g, r] = mins[m_first + r * n_groups + g]


@kernel_only()
def transpose_block_mins(q, first, row_bytes, n_weight_rows, n_groups, out):
    """transpose_mins of Q4_1 blocks from byte ``first`` of q: each block's f16 min m."""
    u = q.view(np.uint8)
    for r in range(n_weight_rows):
        for g in range(n_groups):
            out[g, r] = half_at(u, first + r * row_bytes + g * Q41_BLOCK + 2)


@numba.njit(cache=True)
def min_terms(mins_t, n_weight_rows, group_sums, n0, n_groups, out):
    """out[i, r] = intdot.min_sum of weight row r (mins_t from transpose_mins) with activation
    row n0 + i of the 2-D ``group_sums``, i < ROW_BLOCK: each the same in-order chain of fused
    multiply-adds from g = 0, the chains of all rows advanced together (vectorized over r)."""
    out[:, :n_weight_rows] = 0.0
    for g in range(n_groups):
        m = mins_t[g, :n_weight_rows]
        for i in range(ROW_BLOCK):
            s, terms = group_sums[n0 + i, g], out[i, :n_weight_rows]
            for r in range(n_weight_rows):
                terms[r] = fma32(m[r], s, terms[r])


@numba.njit(cache=True)
def _prefetch_share(q, first, tile_bytes, share, n_shares, end):
    """Ask for part ``share`` of ``n_shares`` of the tile_bytes bytes from ``first`` (the next
    tile's lines, spread over the blocks of rows the current tile runs)."""
    part = (tile_bytes + n_shares - 1) // n_shares
    lo = first + share * part
    _prefetch_rows(q, lo, min(lo + part, first + tile_bytes), end)


@kernel_only()
def _tile_pass(weights, lin, rounded, k, s0, s_blocks, r0, r1, block, first, end, width):
    """block[b, i, r - r0] := the products of weight rows r0..r1 with activation row s0 + b *
    ROW_BLOCK + i, b < s_blocks: weight tile (of ``width`` rows) by weight tile, each against
    every block of rows of the pass while it sits in L1. ``first``: whether the weights come
    from memory (the first pass), then the next tile's lines are asked for a share per block,
    so the streaming is spread over the whole tile's work instead of stalling its first block."""
    q, scales = weights.q, weights.scales
    cols, shift, nib = lin[sk.COLS], lin[sk.SHIFT], lin[sk.NIB]
    groups = cols >> shift
    codes, code_scales = rounded.ints[k], rounded.int_scales[k]
    row_bytes = tile_row_bytes(cols, nib)
    tile_bytes = width * row_bytes
    tiled_end = r0 + (r1 - r0) // width * width
    if first:  # the item's first tile: every line asked for at once
        _prefetch_rows(q, lin[sk.Q_OFF] + r0 * row_bytes, lin[sk.Q_OFF] + r0 * row_bytes + tile_bytes, end)
    for r in range(r0, tiled_end, width):
        row_start, s_start = lin[sk.Q_OFF] + r * row_bytes, lin[sk.S_OFF] + r * groups
        for b in range(s_blocks):
            if first:
                _prefetch_share(q, row_start + tile_bytes, tile_bytes, b, s_blocks, end)
            dot_tile_rows(
                width,
                q,
                row_start,
                row_bytes,
                codes,
                s0 + b * ROW_BLOCK,
                scales,
                s_start,
                groups,
                code_scales,
                shift,
                nib,
                block[b],
                r - r0,
            )


@kernel_only()
def _rest_rows(weights, lin, rounded, k, s0, s_blocks, r0, r1, block, one, width):
    """The weight rows past the item's whole tiles of ``width`` rows, one at a time, into
    ``block`` as _tile_pass."""
    q, scales = weights.q, weights.scales
    cols, shift, nib = lin[sk.COLS], lin[sk.SHIFT], lin[sk.NIB]
    groups = cols >> shift
    codes, code_scales = rounded.ints[k], rounded.int_scales[k]
    row_bytes = tile_row_bytes(cols, nib)
    for r in range(r0 + (r1 - r0) // width * width, r1):
        row_start, s_start = lin[sk.Q_OFF] + r * row_bytes, lin[sk.S_OFF] + r * groups
        for b in range(s_blocks):
            n0 = s0 + b * ROW_BLOCK
            if nib >= 0:
                dot_rows_nib(q, row_start, codes, n0, scales, s_start, code_scales, groups, nib, one)
            else:
                dot_rows_int(q, row_start, codes, n0, scales, s_start, code_scales, groups, shift, one)
            # Element stores, not a slice store: numba compiles a slice store's shape-mismatch
            # message (string formatting, ~3 s of a cold start) though it never raises.
            for i in range(ROW_BLOCK):
                block[b, i, r - r0] = one[i]


def _tile_product(width: int):
    """The product of several token rows through tiles ``width`` weight rows wide, compiled
    apart for each width (a pointer-call site each: step_products), named for it."""

    def dot_tiles(weights, lin, rounded, k, n_rows, r0, r1, out, accumulate, scratch):
        """out[n, 0 : r1-r0] (+)= rows r0..r1 of the block-format linear ``lin`` times row n of
        slot k's rounded input, n < n_rows (> 1): ``width`` weight rows x ROW_BLOCK activation
        rows per register tile, in passes over PASS_BLOCKS blocks of activation rows (each
        weight tile against every block of a pass while it sits in L1), the rows past a whole
        tile one at a time; ``scratch[0]`` (ROW_BLOCK,) holds the latter's values."""
        mins, bias = weights.mins, weights.bias
        cols, shift, nib = lin[sk.COLS], lin[sk.SHIFT], lin[sk.NIB]
        groups = cols >> shift
        group_sums = rounded.sums[k]
        row_bytes = tile_row_bytes(cols, nib)
        end = lin[sk.Q_OFF] + lin[sk.ROWS] * row_bytes
        has_mins, has_bias, b_first = lin[sk.M_OFF] >= 0, lin[sk.B_OFF] >= 0, lin[sk.B_OFF]
        block = np.empty((PASS_BLOCKS, ROW_BLOCK, r1 - r0), np.float32)  # (blocks, rows, weight rows) dots
        min_tile = np.zeros((PASS_BLOCKS, ROW_BLOCK, r1 - r0), np.float32)  # (blocks, rows, w rows) min terms
        row_bias = bias[b_first + r0 : b_first + r1] if has_bias else bias[:0]
        mins_t = np.empty((groups if has_mins else 0, r1 - r0), np.float32)  # (groups, weight rows)
        if has_mins and nib == Q4_1_TAG:
            transpose_block_mins(
                weights.q, lin[sk.Q_OFF] + r0 * row_bytes, row_bytes, r1 - r0, groups, mins_t
            )
        elif has_mins:
            transpose_mins(mins, lin[sk.M_OFF] + r0 * groups, r1 - r0, groups, mins_t)
        for s0 in range(0, n_rows, PASS_BLOCKS * ROW_BLOCK):
            s_blocks = min(PASS_BLOCKS, (n_rows - s0 + ROW_BLOCK - 1) // ROW_BLOCK)
            next_rows = s0 + PASS_BLOCKS * ROW_BLOCK
            _prefetch_codes(
                rounded.ints[k], next_rows, min(n_rows, next_rows + PASS_BLOCKS * ROW_BLOCK), cols
            )
            _tile_pass(weights, lin, rounded, k, s0, s_blocks, r0, r1, block, s0 == 0, end, width)
            _rest_rows(weights, lin, rounded, k, s0, s_blocks, r0, r1, block, scratch[0], width)
            for b in range(s_blocks):
                n0 = s0 + b * ROW_BLOCK
                live = min(ROW_BLOCK, n_rows - n0)  # rows past n_rows are zero padding: computed, not stored
                if has_mins:
                    min_terms(mins_t, r1 - r0, group_sums, n0, groups, min_tile[b])
                _finish(block[b], min_tile[b], has_mins, row_bias, has_bias, out[n0 : n0 + live], accumulate)

    dot_tiles.__name__ = dot_tiles.__qualname__ = f"dot_tiles_w{width}"
    return numba.njit(cache=True, no_cfunc_wrapper=True)(dot_tiles)


dot_tile_many = _tile_product(TILE_W)  # many blocks of token rows: prefill chunks, long verify runs
dot_tile_narrow = _tile_product(NARROW_W)  # rows that fit one block: lockstep batches, short verifies
