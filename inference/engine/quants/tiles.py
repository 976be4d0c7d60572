"""Register tiles of the integer group dot product: TILE_W (or NARROW_W) weight rows x ROW_BLOCK
activation rows.

A prefill multiplies each weight row with many activation rows. ``dot_rows_int`` takes one
weight row against ROW_BLOCK activation rows; here TILE_W consecutive weight rows go through
the group loop together, so each loaded activation group feeds TILE_W products and each
prepared weight group ROW_BLOCK. Every (weight row, activation row) value is the one-row
kernel's (intdot.dot_row_int / nibbles.dot_row_nib), bit for bit:

- ``vnni`` on a CPU with AVX-512 (VNNI, BW): tile_ir.wide_tile_dots, two weight rows per
  512-bit vector (int8 codes in groups of 16 or 32, unsigned 4-bit codes); packed codes stored
  with an offset (Q4_0) take the 256-bit tile;
- every other case: intdot_ir.row_dots over the tile, the selection's own instructions.

A tile is TILE_W weight rows wide for a prefill's many blocks of token rows (each weight group
loaded once for more products), or NARROW_W for a product whose token rows fit one block (a
lockstep batch of 3-4 rows, a short verify run), which streams its weights as decode does: the
width is a constant of the caller, each width its own code. ``dot_tile_rows`` (its signature at
the end of the module) is the host's tile.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..jit.intrinsics import element_pointer
from ..jit.simd import SELECTIONS, for_selection, literal_strings, target_features
from .codes import INT8_16, INT8_32, NIBBLES, NIBBLES_8, Q4_1_BLOCKS, Q5_0_BLOCKS, Q8_0_BLOCKS
from .intdot import HOST_SIMD, ROW_BLOCK, _row_pointer
from .intdot_ir import row_dots, switch_layouts
from .intdot_reference import dot_row_bitwise_reference
from .tile_ir import wide_tile_dots

TILE_W = 8  # weight rows per tile (four 512-bit pairs): measured faster than 4, most for nibbles
# Weight rows per tile when the token rows fit one block. A 4-row lockstep step through tiles
# of 2 against 8 (bench/decode_ab.py --work batch4, paired): SmolLM2 / Qwen2.5 / Gemma 3 1.10x
# / 1.22x / 1.36x on AVX-512 VNNI, 1.07x / 1.24x / 1.41x on AVX2 (tiles of 4: 0.97-1.04x);
# a 16-row prefill 0.87-0.94x, so prefills keep TILE_W.
NARROW_W = 2
WIDE_FEATURES = ("avx512f", "avx512bw", "avx512vl", "avx512vnni")
# Whether this process's vnni selection may use 512-bit vectors (the kernels of the other
# tiles are defined everywhere; only those the CPU runs are compiled).
WIDE = HOST_SIMD == "vnni" and all(f in target_features() for f in WIDE_FEATURES)


# Every layout a tile reads, the int8 codes in groups of 32 last: what any other tag runs.
TILE_LAYOUTS = (Q4_1_BLOCKS, Q5_0_BLOCKS, Q8_0_BLOCKS, NIBBLES, NIBBLES_8, INT8_16, INT8_32)


@intrinsic(prefer_literal=True)
def tile(
    typingctx,
    simd,
    width,
    nib,
    group_shift,
    q,
    q_start,
    row_bytes,
    ints,
    n0,
    scales,
    s_start,
    n_groups,
    int_scales,
    out,
    col0,
):
    """``tile(simd, width, nib, group_shift, q, q_start, row_bytes, ints, n0, scales, s_start,
    n_groups, int_scales, out, col0)``: dot_tile_rows through selection ``simd`` (a constant
    string; "wide" is vnni with two weight rows per 512-bit vector, tile_ir.py, which nibbles
    stored plus an offset leave to the 256-bit tile), ``width`` weight rows (a constant,
    TILE_W or NARROW_W). The layout of the weight codes (codes.py) is chosen at run time from
    ``nib`` and ``group_shift``: the code of every layout is emitted."""
    chosen = literal_strings(simd)
    if chosen is None or not isinstance(width, types.IntegerLiteral):
        return None
    (selection,) = chosen
    n_weight_rows = width.literal_value
    assert n_weight_rows in (TILE_W, NARROW_W)
    sig = types.void(
        simd,
        width,
        nib,
        group_shift,
        q,
        q_start,
        row_bytes,
        ints,
        n0,
        scales,
        s_start,
        n_groups,
        int_scales,
        out,
        col0,
    )

    def codegen(context, builder, signature, args):
        t, a = signature.args[1:], args[1:]  # the literal selection carries no value
        i64 = [context.cast(builder, a[i], t[i], types.int64) for i in (1, 2, 4, 5, 7, 9, 10)]
        tag, shift, q_start, row_bytes, n0, s_start, n_groups = i64
        act_rows = []
        for i in range(ROW_BLOCK):
            row = builder.add(n0, ir.Constant(ir.IntType(64), i))
            act_rows.append(
                (
                    _row_pointer(context, builder, t[6], a[6], row),
                    _row_pointer(context, builder, t[11], a[11], row),
                )
            )
        col0 = context.cast(builder, a[13], t[13], types.int64)
        out_rows = [
            _row_pointer(context, builder, t[12], a[12], ir.Constant(ir.IntType(64), i))
            for i in range(ROW_BLOCK)
        ]

        weight_rows = []
        for w in range(n_weight_rows):
            k = ir.Constant(ir.IntType(64), w)
            q_at = builder.add(q_start, builder.mul(k, row_bytes))
            s_at = builder.add(s_start, builder.mul(k, n_groups))
            weight_rows.append(
                (
                    element_pointer(context, builder, t[3], a[3], q_at),
                    element_pointer(context, builder, t[8], a[8], s_at),
                )
            )

        def emit(layout):
            if selection == "wide" and not (layout.packed and layout.offset and layout.block is None):
                sums = wide_tile_dots(builder, layout, weight_rows, act_rows, n_groups)
            else:
                narrow = "vnni" if selection == "wide" else selection
                sums = row_dots(builder, narrow, layout, weight_rows, act_rows, n_groups)
            for w, row in enumerate(sums):
                column = builder.add(col0, ir.Constant(ir.IntType(64), w))
                for i, value in enumerate(row):
                    builder.store(value, builder.gep(out_rows[i], [column]))

        switch_layouts(builder, tag, shift, TILE_LAYOUTS, emit)
        return context.get_dummy_value()

    return sig, codegen


def _tile_rows(simd: str):
    """dot_tile_rows compiled for ``simd`` (a selection, or "wide"): one call per tile, inlined
    into its caller (no call per tile: no reference counts)."""

    def dot_tile_rows(
        width,
        q,
        q_start,
        row_bytes,
        ints,
        n0,
        scales,
        s_start,
        n_groups,
        int_scales,
        group_shift,
        nib,
        out,
        col0,
    ):
        tile(
            simd,
            width,
            nib,
            group_shift,
            q,
            q_start,
            row_bytes,
            ints,
            n0,
            scales,
            s_start,
            n_groups,
            int_scales,
            out,
            col0,
        )

    return for_selection(dot_tile_rows, simd, inline="always")


# Each tile: "wide" (512-bit, needs WIDE_FEATURES) and each selection's own (simd.py).
SELECTED = {simd: _tile_rows(simd) for simd in ("wide", *SELECTIONS)}
# dot_tile_rows(width, q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales,
# group_shift, nib, out, col0): out[i, col0 + w] = the one-row kernel's value for weight row w
# < width (a constant: NARROW_W or TILE_W; codes from byte q_start + w * row_bytes of the flat ``q``, scales
# from s_start + w * n_groups of the flat ``scales``) and activation row n0 + i < n0 +
# ROW_BLOCK of the 2-D ``ints`` (rows, cols) and ``int_scales`` (rows, groups). ``nib`` is a
# layout's tag (codes.py): -1 for int8 codes in groups of 1 << group_shift, the offset of packed
# nibbles (groups of 32), or the tag of the file's Q5_0, Q8_0 or Q4_1 blocks (scales inside
# them, ``scales`` unused; Q4_1's min terms left to the caller).
# ``out`` is a C-contiguous 2-D float32 array of at least ROW_BLOCK rows.
dot_tile_rows = SELECTED["wide" if WIDE else HOST_SIMD]


def dot_tile_reference(
    q: np.ndarray, scales: np.ndarray, ints: np.ndarray, int_scales: np.ndarray
) -> np.ndarray:
    """numpy, bit for bit: int8 codes q (w, cols), scales (w, groups) against ints (n, cols),
    int_scales (n, groups) -> (w, n) float32, each the one-row kernel's value (slow)."""
    out = np.empty((q.shape[0], ints.shape[0]), np.float32)  # (w, n)
    for w in range(q.shape[0]):
        for i in range(ints.shape[0]):
            out[w, i] = dot_row_bitwise_reference(q[w], ints[i], scales[w], int_scales[i])
    return out
