"""Integer dot products of an int8 weight row with int8-rounded activations, group by group.

ggml multiplies a quantized row with activations it has rounded to int8 (Q8_0/Q8_1/Q8_K):
per group, an exact integer sum of code products, then one float multiply by the weight's and
the activation block's scales. numba's vectorizer does not produce that shape from plain loops
(a reduction per 16-32 values ran at 2-3 GB/s), and the float form (q * scale * value per
weight) costs four vector instructions per eight weights. So the group loop is written as LLVM
vector IR in a numba intrinsic: per group, sign-extend the codes, multiply, add lane pairs
(the pattern x86 lowers to ``vpmaddwd``), fold to eight int32 lanes, convert, and accumulate
``scale * sum`` in eight float lanes; one horizontal sum per row. Measured on one thread: 27-29
against 16-17 GB/s from cache, and with two threads from memory 23-30 against 15-24 GB/s.

The arithmetic is ggml's: integer sums are exact, so results differ from the float form only
in float summation order (dot_row_reference is the numpy reference).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..intrinsics import element_pointer, fma32


LANES = 8
ROW_BLOCK = 4  # activation rows per weight pass in dot_rows_int


# Float operations carry this flag, which changes no result: numba's fastmath pass adds its
# reassociating flags only to instructions that have none, and this code can end up inside a
# fastmath kernel, where the one-row and the multi-row sums would then be reordered differently.
EXACT = ("ninf",)


def _constant_vector(values: list[int]) -> ir.Constant:
    return ir.Constant(ir.VectorType(ir.IntType(32), len(values)), values)


def _group_term_lanes(builder, group: int, weights, a_ptr):
    """The integer products of one group folded to 8 int32 lanes as ggml's AVX2 kernels fold
    them (``maddubs`` then ``madd``): for groups of 32, lane j sums products 4j..4j+3; for
    groups of 16, products 2j and 2j+1. Integer sums are exact; the layout matters because
    each lane is converted and scaled separately."""
    wide = ir.VectorType(ir.IntType(32), group)
    a_vec = builder.load(builder.bitcast(a_ptr, ir.VectorType(ir.IntType(16), group).as_pointer()), align=2)
    products = builder.mul(weights, builder.sext(a_vec, wide))
    evens = builder.shuffle_vector(products, products, _constant_vector(list(range(0, group, 2))))
    odds = builder.shuffle_vector(products, products, _constant_vector(list(range(1, group, 2))))
    pairs = builder.add(evens, odds)  # (group / 2,) int32 (x86: vpmaddwd)
    if group == 32:
        even_pairs = builder.shuffle_vector(pairs, pairs, _constant_vector(list(range(0, 16, 2))))
        odd_pairs = builder.shuffle_vector(pairs, pairs, _constant_vector(list(range(1, 16, 2))))
        pairs = builder.add(even_pairs, odd_pairs)  # (8,) int32
    return pairs


def _fma(builder, a, b, c):
    """a * b + c rounded once (llvm.fma: an FMA instruction where the CPU has one, else libm's
    exact fmaf), as ggml's ``_mm256_fmadd_ps`` accumulates."""
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(a.type, [a.type, a.type, a.type]), f"llvm.fma.v{LANES}f32"
    )
    return builder.call(fn, [a, b, c])


def _lane_sum(builder, total):
    """The 8 lanes summed as ggml's hsum_float_8: ((x4 + x0) + (x6 + x2)) + ((x5 + x1) + (x7 + x3))."""
    lane = [builder.extract_element(total, ir.Constant(ir.IntType(32), i)) for i in range(LANES)]
    r = [builder.fadd(lane[4 + i], lane[i], flags=EXACT) for i in range(4)]
    low, high = builder.fadd(r[0], r[2], flags=EXACT), builder.fadd(r[1], r[3], flags=EXACT)
    return builder.fadd(low, high, flags=EXACT)


def _row_dots(context, builder, group, n_rows, q0, a_rows, s0, d_rows, n_groups):
    """Per row i: sum over groups of scales[g] * int_scales_i[g] * (q . codes_i) -> n_rows
    float32 values. The weight group is loaded and widened once for all rows."""
    i32, floats = ir.IntType(32), ir.VectorType(ir.FloatType(), LANES)
    accs = [cgutils.alloca_once_value(builder, ir.Constant(floats, None)) for _ in range(n_rows)]
    with cgutils.for_range(builder, n_groups) as loop:
        g = loop.index
        offset = builder.mul(g, ir.Constant(g.type, group))
        q_ptr = builder.bitcast(builder.gep(q0, [offset]), ir.VectorType(ir.IntType(8), group).as_pointer())
        weights = builder.sext(builder.load(q_ptr, align=1), ir.VectorType(i32, group))
        scale = builder.load(builder.gep(s0, [g]))
        for acc, a0, d0 in zip(accs, a_rows, d_rows, strict=True):
            factor = builder.fmul(scale, builder.load(builder.gep(d0, [g])), flags=EXACT)
            splat = builder.insert_element(ir.Constant(floats, ir.Undefined), factor, ir.Constant(i32, 0))
            splat = builder.shuffle_vector(splat, splat, _constant_vector([0] * LANES))
            lanes = builder.sitofp(_group_term_lanes(builder, group, weights, builder.gep(a0, [offset])), floats)
            builder.store(_fma(builder, lanes, splat, builder.load(acc)), acc)
    return [_lane_sum(builder, builder.load(acc)) for acc in accs]


def _group_dot_intrinsic(group: int):
    """An intrinsic ``f(q, q_start, ints, scales, s_start, int_scales, n_groups) -> float32``:
    sum over groups g of scales[s_start + g] * int_scales[g] * sum_j q[q_start + g*G + j] *
    ints[g*G + j] for groups of ``group`` (16 or 32) int8 weights and int16 activations."""

    @intrinsic
    def group_dot(typingctx, q, q_start, ints, scales, s_start, int_scales, n_groups):
        sig = types.float32(q, q_start, ints, scales, s_start, int_scales, n_groups)

        def codegen(context, builder, signature, args):
            q_type, _, ints_type, scales_type, _, int_scales_type, _ = signature.args
            q_arr, q_start, ints_arr, scales_arr, s_start, int_scales_arr, n_groups = args
            zero = ir.Constant(ir.IntType(64), 0)
            q0 = element_pointer(context, builder, q_type, q_arr, q_start)
            a0 = element_pointer(context, builder, ints_type, ints_arr, zero)
            s0 = element_pointer(context, builder, scales_type, scales_arr, s_start)
            d0 = element_pointer(context, builder, int_scales_type, int_scales_arr, zero)
            return _row_dots(context, builder, group, 1, q0, [a0], s0, [d0], n_groups)[0]

        return sig, codegen

    return group_dot


def _row_pointer(context, builder, array_type, array, row):
    """A pointer to array[row, 0] of a 2-D array."""
    view = context.make_array(array_type)(context, builder, array)
    zero = ir.Constant(ir.IntType(64), 0)
    return cgutils.get_item_pointer(context, builder, array_type, view, [row, zero])


def _group_dot_rows_intrinsic(group: int, n_rows: int):
    """An intrinsic ``f(q, q_start, ints, n0, scales, s_start, int_scales, n_groups, out)``:
    out[i] = the group_dot of weight row q[q_start:] with activation row n0 + i of the 2-D
    ``ints`` / ``int_scales``, for i < n_rows, the weights read once for all of them."""

    @intrinsic
    def group_dot_rows(typingctx, q, q_start, ints, n0, scales, s_start, int_scales, n_groups, out):
        sig = types.void(q, q_start, ints, n0, scales, s_start, int_scales, n_groups, out)

        def codegen(context, builder, signature, args):
            q_type, _, ints_type, n0_type, scales_type, _, int_scales_type, _, out_type = signature.args
            q_arr, q_start, ints_arr, n0, scales_arr, s_start, int_scales_arr, n_groups, out_arr = args
            first = context.cast(builder, n0, n0_type, types.int64)
            rows = [builder.add(first, ir.Constant(ir.IntType(64), i)) for i in range(n_rows)]
            q0 = element_pointer(context, builder, q_type, q_arr, q_start)
            s0 = element_pointer(context, builder, scales_type, scales_arr, s_start)
            a_rows = [_row_pointer(context, builder, ints_type, ints_arr, r) for r in rows]
            d_rows = [_row_pointer(context, builder, int_scales_type, int_scales_arr, r) for r in rows]
            sums = _row_dots(context, builder, group, n_rows, q0, a_rows, s0, d_rows, n_groups)
            for i, value in enumerate(sums):
                builder.store(value, element_pointer(context, builder, out_type, out_arr, ir.Constant(ir.IntType(64), i)))
            return context.get_dummy_value()

        return sig, codegen

    return group_dot_rows


_group_dot_16 = _group_dot_intrinsic(16)
_group_dot_32 = _group_dot_intrinsic(32)
_group_dot_rows_16 = _group_dot_rows_intrinsic(16, ROW_BLOCK)
_group_dot_rows_32 = _group_dot_rows_intrinsic(32, ROW_BLOCK)


@numba.njit(cache=True)
def dot_row_int(q, q_start, ints, scales, s_start, int_scales, n_groups, group_shift):
    """Sum over groups of scales * int_scales * (int8 codes . int16 codes), for groups of 16
    (group_shift 4) or 32 weights; q, ints, scales, int_scales are contiguous 1-D arrays."""
    if group_shift == 4:
        return _group_dot_16(q, q_start, ints, scales, s_start, int_scales, n_groups)
    return _group_dot_32(q, q_start, ints, scales, s_start, int_scales, n_groups)


@numba.njit(cache=True)
def dot_rows_int(q, q_start, ints, n0, scales, s_start, int_scales, n_groups, group_shift, out):
    """out[i] = dot_row_int of the weight row with activation rows n0 + i of the 2-D ``ints``
    (rows, cols) and ``int_scales`` (rows, groups), for i < ROW_BLOCK: bitwise the same values
    as ROW_BLOCK calls of dot_row_int, with the weights read once."""
    if group_shift == 4:
        _group_dot_rows_16(q, q_start, ints, n0, scales, s_start, int_scales, n_groups, out)
    else:
        _group_dot_rows_32(q, q_start, ints, n0, scales, s_start, int_scales, n_groups, out)


@numba.njit(cache=True)
def min_sum(mins, m_start, group_sums, n_groups):
    """sum_g mins[m_start + g] * group_sums[g], fused multiply-adds in order from g = 0 (a
    row's min term, which ggml too keeps apart and adds to the scaled integer sum at the end)."""
    total = np.float32(0.0)
    for g in range(n_groups):
        total = fma32(mins[m_start + g], group_sums[g], total)
    return total


@numba.njit(cache=True)
def min_sums_block(mins, m_start, group_sums, n0, n_groups, out):
    """out[i] = min_sum for rows n0 + i (i < ROW_BLOCK) of the 2-D ``group_sums``: the same
    sums, as four independent chains in one pass over the mins."""
    s0 = s1 = s2 = s3 = np.float32(0.0)
    a, b, c, d = group_sums[n0], group_sums[n0 + 1], group_sums[n0 + 2], group_sums[n0 + 3]
    for g in range(n_groups):
        m = mins[m_start + g]
        s0, s1 = fma32(m, a[g], s0), fma32(m, b[g], s1)
        s2, s3 = fma32(m, c[g], s2), fma32(m, d[g], s3)
    out[0], out[1], out[2], out[3] = s0, s1, s2, s3


def dot_row_reference(q: np.ndarray, ints: np.ndarray, scales: np.ndarray, int_scales: np.ndarray) -> float:
    """numpy: one row's q (cols,) int8 against ints (cols,), per-group scales -> float64."""
    group = q.shape[0] // scales.shape[0]
    sums = (q.astype(np.int64) * ints.astype(np.int64)).reshape(-1, group).sum(axis=1)  # (groups,)
    return float((scales.astype(np.float64) * int_scales.astype(np.float64) * sums).sum())
