"""Register tiles of the integer group dot product: TILE_W weight rows x ROW_BLOCK activation rows.

A prefill multiplies each weight row with many activation rows. ``dot_rows_int`` takes one
weight row against ROW_BLOCK activation rows; here TILE_W consecutive weight rows go through
the group loop together, so each loaded activation group feeds TILE_W products and each
prepared weight group ROW_BLOCK. Every (weight row, activation row) value is the one-row
kernel's (intdot.dot_row_int / nibbles.dot_row_nib), bit for bit:

- ``vnni`` on a CPU with AVX-512 (VNNI, BW): tile_ir.wide_tile_dots, two weight rows per
  512-bit vector (int8 codes in groups of 16 or 32, unsigned 4-bit codes); packed codes stored
  with an offset (Q4_0) take the 256-bit tile;
- every other case: intdot_ir.row_dots over the tile, the selection's own instructions.

``dot_tile_rows`` (its signature at the end of the module) is the host's tile.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..jit.intrinsics import element_pointer
from ..jit.simd import target_features
from .intdot import HOST_SIMD, ROW_BLOCK, _row_pointer
from .intdot_ir import Q41_OFFSET, Q80_OFFSET, QUINT_OFFSET, row_dots
from .intdot_reference import dot_row_bitwise_reference
from .tile_ir import wide_tile_dots

TILE_W = 8  # weight rows per tile (four 512-bit pairs): measured faster than 4, most for nibbles
WIDE_FEATURES = ("avx512f", "avx512bw", "avx512vl", "avx512vnni")
# Whether this process's vnni selection may use 512-bit vectors (the kernels of the other
# tiles are defined everywhere; only those the CPU runs are compiled).
WIDE = HOST_SIMD == "vnni" and all(f in target_features() for f in WIDE_FEATURES)


def _tile_intrinsic(group: int, simd: str, nibble_offset: int | None, wide: bool):
    """An intrinsic ``f(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales,
    out, col0)``: the module's dot_tile_rows for one group size, code packing and selection."""

    @intrinsic
    def tile(typingctx, q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0):
        sig = types.void(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)

        def codegen(context, builder, signature, args):
            t = signature.args
            i64 = [context.cast(builder, args[i], t[i], types.int64) for i in (1, 2, 4, 6, 7)]
            q_start, row_bytes, n0, s_start, n_groups = i64
            weight_rows = []
            for w in range(TILE_W):
                k = ir.Constant(ir.IntType(64), w)
                q_at = builder.add(q_start, builder.mul(k, row_bytes))
                s_at = builder.add(s_start, builder.mul(k, n_groups))
                weight_rows.append(
                    (
                        element_pointer(context, builder, t[0], args[0], q_at),
                        element_pointer(context, builder, t[5], args[5], s_at),
                    )
                )
            act_rows = []
            for i in range(ROW_BLOCK):
                row = builder.add(n0, ir.Constant(ir.IntType(64), i))
                act_rows.append(
                    (
                        _row_pointer(context, builder, t[3], args[3], row),
                        _row_pointer(context, builder, t[8], args[8], row),
                    )
                )
            if wide:
                sums = wide_tile_dots(builder, group, weight_rows, act_rows, n_groups, nibble_offset)
            else:
                sums = row_dots(builder, simd, group, weight_rows, act_rows, n_groups, nibble_offset)
            col0 = context.cast(builder, args[10], t[10], types.int64)
            out_rows = [
                _row_pointer(context, builder, t[9], args[9], ir.Constant(ir.IntType(64), i))
                for i in range(ROW_BLOCK)
            ]
            for w, row in enumerate(sums):
                column = builder.add(col0, ir.Constant(ir.IntType(64), w))
                for i, value in enumerate(row):
                    builder.store(value, builder.gep(out_rows[i], [column]))
            return context.get_dummy_value()

        return sig, codegen

    return tile


def _variants(simd: str, wide: bool):
    """(int8 groups of 16, int8 groups of 32, nibbles offset 0, nibbles offset 8, Q5_0 blocks,
    Q8_0 blocks, Q4_1 blocks without their mins) tiles. Nibbles stored with an offset take the
    256-bit tile of the selection (the wide tile takes unsigned 4-bit codes only)."""
    return (
        _tile_intrinsic(16, simd, None, wide),
        _tile_intrinsic(32, simd, None, wide),
        _tile_intrinsic(32, simd, 0, wide),
        _tile_intrinsic(32, simd, 8, False),
        _tile_intrinsic(32, simd, QUINT_OFFSET, wide),
        _tile_intrinsic(32, simd, Q80_OFFSET, wide),
        _tile_intrinsic(32, simd, Q41_OFFSET, wide),
    )


_generic = _variants("generic", False)
_avx2 = _variants("avx2", False)
_vnni = _variants("vnni", False)
_wide = _variants("vnni", True)
_g16, _g32, _g0, _g8, _g5, _g80, _g41 = _generic
_a16, _a32, _a0, _a8, _a5, _a80, _a41 = _avx2
_v16, _v32, _v0, _v8, _v5, _v80, _v41 = _vnni
_w16, _w32, _w0, _w8, _w5, _w80, _w41 = _wide


@numba.njit(cache=True, inline="always")  # no call per tile: no reference counts
def generic_dot_tile_rows(
    q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, group_shift, nib, out, col0
):
    """dot_tile_rows through the generic instruction selection."""
    if nib == 0:
        _g0(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif nib == QUINT_OFFSET:
        _g5(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif nib == Q80_OFFSET:
        _g80(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif nib == Q41_OFFSET:
        _g41(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif nib > 0:
        _g8(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif group_shift == 4:
        _g16(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    else:
        _g32(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)


@numba.njit(cache=True, inline="always")  # no call per tile: no reference counts
def avx2_dot_tile_rows(
    q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, group_shift, nib, out, col0
):
    """dot_tile_rows through AVX2 (only where the CPU has AVX2)."""
    if nib == 0:
        _a0(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif nib == QUINT_OFFSET:
        _a5(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif nib == Q80_OFFSET:
        _a80(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif nib == Q41_OFFSET:
        _a41(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif nib > 0:
        _a8(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif group_shift == 4:
        _a16(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    else:
        _a32(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)


@numba.njit(cache=True, inline="always")  # no call per tile: no reference counts
def vnni_dot_tile_rows(
    q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, group_shift, nib, out, col0
):
    """dot_tile_rows through 256-bit VNNI (AVX-VNNI or AVX-512 VL; only where the CPU has it)."""
    if nib == 0:
        _v0(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif nib == QUINT_OFFSET:
        _v5(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif nib == Q80_OFFSET:
        _v80(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif nib == Q41_OFFSET:
        _v41(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif nib > 0:
        _v8(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif group_shift == 4:
        _v16(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    else:
        _v32(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)


@numba.njit(cache=True, inline="always")  # no call per tile: no reference counts
def wide_dot_tile_rows(
    q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, group_shift, nib, out, col0
):
    """dot_tile_rows through 512-bit VNNI pairs (only where the CPU has AVX-512 VNNI and BW)."""
    if nib == 0:
        _w0(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif nib == QUINT_OFFSET:
        _w5(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif nib == Q80_OFFSET:
        _w80(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif nib == Q41_OFFSET:
        _w41(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif nib > 0:
        _w8(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    elif group_shift == 4:
        _w16(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)
    else:
        _w32(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales, out, col0)


# Each tile: "wide" (512-bit, needs WIDE_FEATURES) and each selection's own (simd.py).
SELECTED = {
    "wide": wide_dot_tile_rows,
    "vnni": vnni_dot_tile_rows,
    "avx2": avx2_dot_tile_rows,
    "generic": generic_dot_tile_rows,
}
# dot_tile_rows(q, q_start, row_bytes, ints, n0, scales, s_start, n_groups, int_scales,
# group_shift, nib, out, col0): out[i, col0 + w] = the one-row kernel's value for weight row w
# < TILE_W (codes from byte q_start + w * row_bytes of the flat ``q``, scales from s_start + w *
# n_groups of the flat ``scales``) and activation row n0 + i < n0 + ROW_BLOCK of the 2-D
# ``ints`` (rows, cols) and ``int_scales`` (rows, groups). nib -1: int8 codes in groups of
# 1 << group_shift; QUINT_OFFSET, Q80_OFFSET or Q41_OFFSET: the file's Q5_0, Q8_0 or Q4_1
# blocks (scales inside them, ``scales`` unused; Q4_1's min terms left to the caller); else
# packed nibbles (groups of 32) stored plus nib.
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
