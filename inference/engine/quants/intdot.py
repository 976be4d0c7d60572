"""Integer dot products of an int8 weight row with int8-rounded activations, group by group.

ggml multiplies a quantized row with activations it has rounded to int8 (Q8_0/Q8_1/Q8_K):
per group, an exact integer sum of code products, then one float multiply by the weight's and
the activation block's scales. numba's vectorizer does not produce that shape from plain loops
(a reduction per 16-32 values ran at 2-3 GB/s), and the float form (q * scale * value per
weight) costs four vector instructions per eight weights. So the group loop is written as LLVM
vector IR in numba intrinsics (intdot_ir.py): per group, the exact integer products folded to
eight int32 lanes as ggml folds them, converted, and accumulated ``scale * lanes`` with FMA;
one horizontal sum per row in ggml's order. ``dot_rows_int`` does ROW_BLOCK activation rows per
pass over a weight row with the same instructions per row, so it gives each row the bits
``dot_row_int`` gives it: a token's product does not depend on the tokens beside it.

Each kernel exists in every instruction selection (``vnni``, ``avx2``, ``generic``: simd.py,
``SELECTED``), compiled from one Python function per kernel (``simd.for_selection``); the
intrinsics below take the selection and the weight codes' layout (codes.py) as constant
strings. ``dot_row_int``, ``dot_rows_int`` and ``dot_pair_int`` are the process's
(HOST_SIMD), and all give the same bits. Activation codes are int8 (ggml's Q8_0/Q8_1/Q8_K
range, -127..127). dot_row_reference is the numpy reference within a rounding bound,
intdot_reference.dot_row_bitwise_reference the one bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..jit.intrinsics import element_pointer, fma32
from ..jit.simd import SELECTIONS, for_selection, host_simd, literal_strings
from .codes import LAYOUTS, GroupCodes
from .intdot_ir import row_dots

ROW_BLOCK = 4  # activation rows per weight pass in dot_rows_int
# The instruction selection of this process (simd.py: the best the CPU has, or LMSERVE_SIMD);
# all give the same bits. The kernels of every selection are defined (tests compare them);
# only those of the CPU's features compile and run.
HOST_SIMD = host_simd()


def literal_choice(simd, codes) -> tuple[str, GroupCodes] | None:
    """The selection and layout named by an intrinsic's two literal arguments (or None)."""
    names = literal_strings(simd, codes)
    return None if names is None else (names[0], LAYOUTS[names[1]])


@intrinsic(prefer_literal=True)
def group_dot(typingctx, simd, codes, q, q_start, ints, scales, s_start, int_scales, n_groups):
    """``group_dot(simd, codes, q, q_start, ints, scales, s_start, int_scales, n_groups) ->
    float32``: sum over groups g of scales[s_start + g] * int_scales[g] * sum_j (weight code j
    of group g) * ints[g*G + j], the weight groups read in layout ``codes`` (codes.py) from
    byte q_start of ``q``, with the instructions of selection ``simd`` (both constant strings)."""
    chosen = literal_choice(simd, codes)
    if chosen is None:
        return None
    selection, layout = chosen
    sig = types.float32(simd, codes, q, q_start, ints, scales, s_start, int_scales, n_groups)

    def codegen(context, builder, signature, args):
        _, _, q_type, _, ints_type, scales_type, _, int_scales_type, _ = signature.args
        _, _, q_arr, q_start, ints_arr, scales_arr, s_start, int_scales_arr, n_groups = args
        zero = ir.Constant(ir.IntType(64), 0)
        q0 = element_pointer(context, builder, q_type, q_arr, q_start)
        a0 = element_pointer(context, builder, ints_type, ints_arr, zero)
        s0 = element_pointer(context, builder, scales_type, scales_arr, s_start)
        d0 = element_pointer(context, builder, int_scales_type, int_scales_arr, zero)
        return row_dots(builder, selection, layout, [(q0, s0)], [(a0, d0)], n_groups)[0][0]

    return sig, codegen


@intrinsic(prefer_literal=True)
def group_dot_pair(
    typingctx, simd, codes, q, q_start, q_next, ints, scales, s_start, s_next, int_scales, n_groups, out
):
    """``group_dot_pair(simd, codes, q, q_start, q_next, ints, scales, s_start, s_next,
    int_scales, n_groups, out)``: out[0], out[1] = the group_dot of weight rows at q_start and
    q_next (scales at s_start, s_next) with one activation row: two independent sums in flight
    for one token."""
    chosen = literal_choice(simd, codes)
    if chosen is None:
        return None
    selection, layout = chosen
    sig = types.void(
        simd, codes, q, q_start, q_next, ints, scales, s_start, s_next, int_scales, n_groups, out
    )

    def codegen(context, builder, signature, args):
        _, _, q_type, _, _, ints_type, scales_type, _, _, int_scales_type, _, out_type = signature.args
        (
            _,
            _,
            q_arr,
            q_start,
            q_next,
            ints_arr,
            scales_arr,
            s_start,
            s_next,
            int_scales_arr,
            n_groups,
            out_arr,
        ) = args
        zero = ir.Constant(ir.IntType(64), 0)
        weight_rows = [
            (
                element_pointer(context, builder, q_type, q_arr, qs),
                element_pointer(context, builder, scales_type, scales_arr, ss),
            )
            for qs, ss in ((q_start, s_start), (q_next, s_next))
        ]
        a0 = element_pointer(context, builder, ints_type, ints_arr, zero)
        d0 = element_pointer(context, builder, int_scales_type, int_scales_arr, zero)
        sums = row_dots(builder, selection, layout, weight_rows, [(a0, d0)], n_groups)
        for i, row in enumerate(sums):
            index = ir.Constant(ir.IntType(64), i)
            builder.store(row[0], element_pointer(context, builder, out_type, out_arr, index))
        return context.get_dummy_value()

    return sig, codegen


def _row_pointer(context, builder, array_type, array, row):
    """A pointer to array[row, 0] of a 2-D array."""
    view = context.make_array(array_type)(context, builder, array)
    zero = ir.Constant(ir.IntType(64), 0)
    return cgutils.get_item_pointer(context, builder, array_type, view, [row, zero])


@intrinsic(prefer_literal=True)
def group_dot_rows(typingctx, simd, codes, q, q_start, ints, n0, scales, s_start, int_scales, n_groups, out):
    """``group_dot_rows(simd, codes, q, q_start, ints, n0, scales, s_start, int_scales,
    n_groups, out)``: out[i] = the group_dot of weight row q[q_start:] with activation row
    n0 + i of the 2-D ``ints`` / ``int_scales``, for i < ROW_BLOCK, the weights read once for
    all of them."""
    chosen = literal_choice(simd, codes)
    if chosen is None:
        return None
    selection, layout = chosen
    sig = types.void(simd, codes, q, q_start, ints, n0, scales, s_start, int_scales, n_groups, out)

    def codegen(context, builder, signature, args):
        _, _, q_type, _, ints_type, n0_type, scales_type, _, int_scales_type, _, out_type = signature.args
        _, _, q_arr, q_start, ints_arr, n0, scales_arr, s_start, int_scales_arr, n_groups, out_arr = args
        first = context.cast(builder, n0, n0_type, types.int64)
        rows = [builder.add(first, ir.Constant(ir.IntType(64), i)) for i in range(ROW_BLOCK)]
        q0 = element_pointer(context, builder, q_type, q_arr, q_start)
        s0 = element_pointer(context, builder, scales_type, scales_arr, s_start)
        a_rows = [_row_pointer(context, builder, ints_type, ints_arr, r) for r in rows]
        d_rows = [_row_pointer(context, builder, int_scales_type, int_scales_arr, r) for r in rows]
        act_rows = list(zip(a_rows, d_rows, strict=True))
        sums = row_dots(builder, selection, layout, [(q0, s0)], act_rows, n_groups)[0]
        for i, value in enumerate(sums):
            index = ir.Constant(ir.IntType(64), i)
            builder.store(value, element_pointer(context, builder, out_type, out_arr, index))
        return context.get_dummy_value()

    return sig, codegen


class IntDots(NamedTuple):
    """One selection's integer dot products of int8 weight codes (signatures below)."""

    row: Callable
    rows: Callable
    pair: Callable


def _int_dots(simd: str) -> IntDots:
    """The three kernels of int8 weight codes in groups of 16 (group_shift 4) or 32, compiled
    for selection ``simd``."""

    def dot_row_int(q, q_start, ints, scales, s_start, int_scales, n_groups, group_shift):
        if group_shift == 4:
            return group_dot(simd, "int8_16", q, q_start, ints, scales, s_start, int_scales, n_groups)
        return group_dot(simd, "int8_32", q, q_start, ints, scales, s_start, int_scales, n_groups)

    def dot_rows_int(q, q_start, ints, n0, scales, s_start, int_scales, n_groups, group_shift, out):
        if group_shift == 4:
            group_dot_rows(simd, "int8_16", q, q_start, ints, n0, scales, s_start, int_scales, n_groups, out)
        else:
            group_dot_rows(simd, "int8_32", q, q_start, ints, n0, scales, s_start, int_scales, n_groups, out)

    def dot_pair_int(
        q, q_start, q_next, ints, scales, s_start, s_next, int_scales, n_groups, group_shift, out
    ):
        if group_shift == 4:
            group_dot_pair(
                simd, "int8_16", q, q_start, q_next, ints, scales, s_start, s_next, int_scales, n_groups, out
            )
        else:
            group_dot_pair(
                simd, "int8_32", q, q_start, q_next, ints, scales, s_start, s_next, int_scales, n_groups, out
            )

    return IntDots(
        for_selection(dot_row_int, simd),
        for_selection(dot_rows_int, simd),
        for_selection(dot_pair_int, simd),
    )


SELECTED = {simd: _int_dots(simd) for simd in SELECTIONS}


# dot_row_int(q, q_start, ints, scales, s_start, int_scales, n_groups, group_shift): the sum over
# groups of scales * int_scales * (int8 codes . int8 codes), for groups of 16 (group_shift 4) or
# 32 weights; q, ints, scales, int_scales contiguous 1-D arrays.
# dot_rows_int(q, q_start, ints, n0, scales, s_start, int_scales, n_groups, group_shift, out):
# out[i] = dot_row_int with activation rows n0 + i of the 2-D ``ints`` (rows, cols) and
# ``int_scales`` (rows, groups), i < ROW_BLOCK: bitwise the same values, weights read once.
# dot_pair_int(q, q_start, q_next, ints, scales, s_start, s_next, int_scales, n_groups,
# group_shift, out): out[0], out[1] = dot_row_int of the weight rows at q_start and q_next with
# one activation row (bitwise the same values; two sums in flight).
dot_row_int, dot_rows_int, dot_pair_int = SELECTED[HOST_SIMD]


@numba.njit(cache=True)
def min_sum(mins, m_start, group_sums, n_groups):
    """sum_g mins[m_start + g] * group_sums[g], fused multiply-adds in order from g = 0 (a
    row's min term, which ggml too keeps apart and adds to the scaled integer sum at the end)."""
    total = np.float32(0.0)
    for g in range(n_groups):
        total = fma32(mins[m_start + g], group_sums[g], total)
    return total


@numba.njit(cache=True)
def min_sums_pair(mins, m_start, m_next, group_sums, n_groups, out):
    """out[0], out[1] = min_sum of the weight rows whose mins start at m_start and m_next, with
    one activation row's group sums: the same sums, as two independent chains."""
    s0 = s1 = np.float32(0.0)
    for g in range(n_groups):
        s0, s1 = fma32(mins[m_start + g], group_sums[g], s0), fma32(mins[m_next + g], group_sums[g], s1)
    out[0], out[1] = s0, s1


def dot_row_reference(q: np.ndarray, ints: np.ndarray, scales: np.ndarray, int_scales: np.ndarray) -> float:
    """numpy: one row's q (cols,) int8 against ints (cols,), per-group scales -> float64."""
    group = q.shape[0] // scales.shape[0]
    sums = (q.astype(np.int64) * ints.astype(np.int64)).reshape(-1, group).sum(axis=1)  # (groups,)
    return float((scales.astype(np.float64) * int_scales.astype(np.float64) * sums).sum())
