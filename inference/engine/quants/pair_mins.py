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

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..jit.intrinsics import element_pointer
from ..jit.simd import SELECTIONS, for_selection, literal_strings
from .codes import INT8_16, INT8_32, NIBBLES, NIBBLES_8
from .intdot import HOST_SIMD, literal_choice
from .intdot_ir import row_dots, switch_layouts

# The arena's layouts with mins (dot_pair_min chooses among them at run time), int8 codes in
# groups of 32 last: what any other tag runs.
ARENA_LAYOUTS = (NIBBLES, NIBBLES_8, INT8_16, INT8_32)


def _emit_pair_min(context, builder, t, a, selection, layout):
    """Store the two rows' dot + min term, ``t`` and ``a`` the types and values of the
    arguments from ``q`` on (q, q_start, q_next, ints, scales, s_start, s_next, int_scales,
    mins, m_start, m_next, sums, n_groups, out)."""
    zero = ir.Constant(ir.IntType(64), 0)

    def pointer(i, index):
        return element_pointer(context, builder, t[i], a[i], index)

    weight_rows = [
        (pointer(0, a[1]), pointer(4, a[5])),
        (pointer(0, a[2]), pointer(4, a[6])),
    ]
    act_rows = [(pointer(3, zero), pointer(7, zero))]
    min_terms = ([pointer(8, a[9]), pointer(8, a[10])], [pointer(11, zero)])
    totals = row_dots(builder, selection, layout, weight_rows, act_rows, a[12], min_terms)
    for i, row in enumerate(totals):
        builder.store(row[0], pointer(13, ir.Constant(ir.IntType(64), i)))


@intrinsic(prefer_literal=True)
def group_dot_pair_min(
    typingctx,
    simd,
    codes,
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
    """``group_dot_pair_min(simd, codes, q, q_start, q_next, ints, scales, s_start, s_next,
    int_scales, mins, m_start, m_next, group_sums, n_groups, out)``: out[0], out[1] = the group
    dot of the weight rows at q_start and q_next (scales at s_start, s_next; layout ``codes``)
    with one activation row, each plus its min term (mins at m_start, m_next, times the row's
    group sums), through selection ``simd`` (both constant strings)."""
    chosen = literal_choice(simd, codes)
    if chosen is None:
        return None
    selection, layout = chosen
    values = (q, q_start, q_next, ints, scales, s_start, s_next, int_scales, mins, m_start, m_next, sums)
    sig = types.void(simd, codes, *values, n_groups, out)

    def codegen(context, builder, signature, args):
        # the literal selection and layout carry no value
        _emit_pair_min(context, builder, signature.args[2:], args[2:], selection, layout)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic(prefer_literal=True)
def arena_dot_pair_min(
    typingctx,
    simd,
    nib,
    group_shift,
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
    """group_dot_pair_min over the arena's codes, their layout (ARENA_LAYOUTS) chosen at run time
    from ``nib`` (the table's tag: -1 int8 codes, else packed nibbles stored plus nib) and
    ``group_shift``; ``simd`` a constant string."""
    chosen = literal_strings(simd)
    if chosen is None:
        return None
    (selection,) = chosen
    values = (q, q_start, q_next, ints, scales, s_start, s_next, int_scales, mins, m_start, m_next, sums)
    sig = types.void(simd, nib, group_shift, *values, n_groups, out)

    def codegen(context, builder, signature, args):
        t, a = signature.args[3:], args[3:]  # the literal selection carries no value
        tag, shift = (context.cast(builder, args[i], signature.args[i], types.int64) for i in (1, 2))

        def emit(layout):
            _emit_pair_min(context, builder, t, a, selection, layout)

        switch_layouts(builder, tag, shift, ARENA_LAYOUTS, emit)
        return context.get_dummy_value()

    return sig, codegen


def _pair_min(simd: str):
    """dot_pair_min compiled for selection ``simd``."""

    def dot_pair_min(
        q, q0, q1, ints, scales, s0, s1, int_scales, mins, m0, m1, sums, n_groups, shift, nib, out
    ):
        arena_dot_pair_min(
            simd, nib, shift, q, q0, q1, ints, scales, s0, s1, int_scales, mins, m0, m1, sums, n_groups, out
        )

    return for_selection(dot_pair_min, simd)


SELECTED = {simd: _pair_min(simd) for simd in SELECTIONS}
# dot_pair_min(q, q0, q1, ints, scales, s0, s1, int_scales, mins, m0, m1, sums, n_groups, shift,
# nib, out): weight rows at q0 and q1 (int8 codes in groups of 1 << shift when nib < 0, else
# packed nibbles stored plus nib, q0/q1 byte offsets), scales at s0/s1, mins at m0/m1; one
# activation row's codes, code scales and group sums -> out[0], out[1].
dot_pair_min = SELECTED[HOST_SIMD]
