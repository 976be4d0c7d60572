"""One token's products with two weight rows of a format with mins, the min terms folded in.

Q4_1, Q5_1 and the K-quants with mins (Q2_K, Q4_K, Q5_K) add per row a min term, sum over
groups of mins[g] * group_sums[g] as one in-order chain of fused multiply-adds (intdot.min_sum,
as ggml keeps it). Run after the dot product, that chain is latency-bound: one FMA per group
waiting on the last (~30% of SmolLM2's decode step). Here it runs inside the dot product's
group loop (intdot_ir.row_dots's ``min_terms``), where the vector work hides its latency:
``dot_pair_min`` gives each row dot + min term, the same operations in the same order as
dot_pair_int / dot_pair_nib followed by min_sums_pair and the add, so the same bits.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..jit.intrinsics import element_pointer
from .intdot import HOST_SIMD
from .intdot_ir import row_dots


def _pair_min_intrinsic(group: int, simd: str, nibble_offset: int | None = None):
    """An intrinsic ``f(q, q_start, q_next, ints, scales, s_start, s_next, int_scales, mins,
    m_start, m_next, group_sums, n_groups, out)``: out[0], out[1] = the group dot of the weight
    rows at q_start and q_next (scales at s_start, s_next) with one activation row, each plus
    its min term (mins at m_start, m_next, times the row's group sums)."""

    @intrinsic
    def dot_pair_min(
        typingctx,
        q,
        q_start,
        q_next,
        ints,
        scales,
        s_start,
        s_next,
        int_scales,
        mins,
        m_start,
        m_next,
        sums,
        n_groups,
        out,
    ):
        sig = types.void(
            q,
            q_start,
            q_next,
            ints,
            scales,
            s_start,
            s_next,
            int_scales,
            mins,
            m_start,
            m_next,
            sums,
            n_groups,
            out,
        )

        def codegen(context, builder, signature, args):
            t = signature.args
            zero = ir.Constant(ir.IntType(64), 0)

            def pointer(i, index):
                return element_pointer(context, builder, t[i], args[i], index)

            weight_rows = [
                (pointer(0, args[1]), pointer(4, args[5])),
                (pointer(0, args[2]), pointer(4, args[6])),
            ]
            act_rows = [(pointer(3, zero), pointer(7, zero))]
            min_terms = ([pointer(8, args[9]), pointer(8, args[10])], [pointer(11, zero)])
            sums = row_dots(builder, simd, group, weight_rows, act_rows, args[12], nibble_offset, min_terms)
            for i, row in enumerate(sums):
                builder.store(row[0], pointer(13, ir.Constant(ir.IntType(64), i)))
            return context.get_dummy_value()

        return sig, codegen

    return dot_pair_min


def _variants(simd: str):
    """(int8 groups of 16, int8 groups of 32, nibbles offset 0, nibbles offset 8)."""
    return (
        _pair_min_intrinsic(16, simd),
        _pair_min_intrinsic(32, simd),
        _pair_min_intrinsic(32, simd, 0),
        _pair_min_intrinsic(32, simd, 8),
    )


_generic_16, _generic_32, _generic_nib0, _generic_nib8 = _variants("generic")
_avx2_16, _avx2_32, _avx2_nib0, _avx2_nib8 = _variants("avx2")
_vnni_16, _vnni_32, _vnni_nib0, _vnni_nib8 = _variants("vnni")


@numba.njit(cache=True)
def generic_dot_pair_min(
    q, q0, q1, ints, scales, s0, s1, int_scales, mins, m0, m1, sums, n_groups, shift, nib, out
):
    """dot_pair_min through the generic instruction selection."""
    if nib == 0:
        _generic_nib0(q, q0, q1, ints, scales, s0, s1, int_scales, mins, m0, m1, sums, n_groups, out)
    elif nib > 0:
        _generic_nib8(q, q0, q1, ints, scales, s0, s1, int_scales, mins, m0, m1, sums, n_groups, out)
    elif shift == 4:
        _generic_16(q, q0, q1, ints, scales, s0, s1, int_scales, mins, m0, m1, sums, n_groups, out)
    else:
        _generic_32(q, q0, q1, ints, scales, s0, s1, int_scales, mins, m0, m1, sums, n_groups, out)


@numba.njit(cache=True)
def avx2_dot_pair_min(
    q, q0, q1, ints, scales, s0, s1, int_scales, mins, m0, m1, sums, n_groups, shift, nib, out
):
    """dot_pair_min through AVX2 (only where the CPU has it)."""
    if nib == 0:
        _avx2_nib0(q, q0, q1, ints, scales, s0, s1, int_scales, mins, m0, m1, sums, n_groups, out)
    elif nib > 0:
        _avx2_nib8(q, q0, q1, ints, scales, s0, s1, int_scales, mins, m0, m1, sums, n_groups, out)
    elif shift == 4:
        _avx2_16(q, q0, q1, ints, scales, s0, s1, int_scales, mins, m0, m1, sums, n_groups, out)
    else:
        _avx2_32(q, q0, q1, ints, scales, s0, s1, int_scales, mins, m0, m1, sums, n_groups, out)


@numba.njit(cache=True)
def vnni_dot_pair_min(
    q, q0, q1, ints, scales, s0, s1, int_scales, mins, m0, m1, sums, n_groups, shift, nib, out
):
    """dot_pair_min through VNNI (only where the CPU has it)."""
    if nib == 0:
        _vnni_nib0(q, q0, q1, ints, scales, s0, s1, int_scales, mins, m0, m1, sums, n_groups, out)
    elif nib > 0:
        _vnni_nib8(q, q0, q1, ints, scales, s0, s1, int_scales, mins, m0, m1, sums, n_groups, out)
    elif shift == 4:
        _vnni_16(q, q0, q1, ints, scales, s0, s1, int_scales, mins, m0, m1, sums, n_groups, out)
    else:
        _vnni_32(q, q0, q1, ints, scales, s0, s1, int_scales, mins, m0, m1, sums, n_groups, out)


SELECTED = {"vnni": vnni_dot_pair_min, "avx2": avx2_dot_pair_min, "generic": generic_dot_pair_min}
# dot_pair_min(q, q0, q1, ints, scales, s0, s1, int_scales, mins, m0, m1, sums, n_groups, shift,
# nib, out): weight rows at q0 and q1 (int8 codes in groups of 1 << shift when nib < 0, else
# packed nibbles stored plus nib, q0/q1 byte offsets), scales at s0/s1, mins at m0/m1; one
# activation row's codes, code scales and group sums -> out[0], out[1].
dot_pair_min = SELECTED[HOST_SIMD]
