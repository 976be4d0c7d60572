"""Numba intrinsics over wide_ir: decode pairs (and quads) of file-block rows in 512-bit registers.

``wide_intrinsic(kind, n_pairs)`` gives ``f(q, q_start, q_next, ints, int_scales, sums,
n_groups, out)``: out[i] = the product of the weight row at byte q_start + i * (q_next -
q_start) of ``q`` (blocks of ``kind``, i < 2 * n_pairs) with one activation row (codes
``ints``, group scales ``int_scales``, group sums ``sums``: read for Q4_1's min terms only),
each with the int8 copy's bits. The format modules (quint.py, q41.py, blocks.py) wrap it in
their own signatures.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..jit.intrinsics import element_pointer
from .wide_ir import Q4_1, Q5_0, Q8_0, pair_dots

KINDS = (Q5_0, Q4_1, Q8_0)


def wide_intrinsic(kind: str, n_pairs: int):
    """The intrinsic of ``n_pairs`` 512-bit pairs of ``kind`` blocks (module docstring)."""

    @intrinsic
    def wide(typingctx, q, q_start, q_next, ints, int_scales, sums, n_groups, out):
        sig = types.void(q, q_start, q_next, ints, int_scales, sums, n_groups, out)

        def codegen(context, builder, signature, args):
            t, i64 = signature.args, ir.IntType(64)

            def pointer(i, index):
                return element_pointer(context, builder, t[i], args[i], index)

            stride = builder.sub(args[2], args[1])
            rows = [
                pointer(0, builder.add(args[1], builder.mul(stride, ir.Constant(i64, i))))
                for i in range(2 * n_pairs)
            ]
            zero = ir.Constant(i64, 0)
            pairs = [(rows[2 * p], rows[2 * p + 1]) for p in range(n_pairs)]
            sums = pair_dots(
                builder, kind, pairs, pointer(3, zero), pointer(4, zero), args[6], pointer(5, zero)
            )
            for i, value in enumerate(v for pair in sums for v in pair):
                builder.store(value, pointer(7, ir.Constant(i64, i)))
            return context.get_dummy_value()

        return sig, codegen

    return wide


PAIR = {kind: wide_intrinsic(kind, 1) for kind in KINDS}
QUAD = {kind: wide_intrinsic(kind, 2) for kind in KINDS}
