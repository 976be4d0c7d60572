"""Integer group dot products over Q4_K and Q6_K weights read as the file packs them.

A decode step reads every weight once per token and is bound by memory bandwidth. The int8
layout keeps a Q6_K matrix as int8 codes and a float32 scale per 16 weights (1.25 bytes a
weight) and a Q4_K matrix as nibbles with a float32 scale and min per 32 (0.75); the file
spends 0.82 and 0.5625. Qwen2.5-Coder-0.5B keeps its ffn_down matrices in these two formats
(72 MB of file bytes, ~104 MB as the int8 layout). A decode step keeps the file's super-blocks
byte for byte (fused.py, a second copy beside the codes the several-row tiles read: the
bytes are copied from the file, ``GroupedMatrix.file_blocks``) and the vector kernel
(kblocks_ir.py) unpacks them in registers: the same integer lanes, the same float32 scales
and mins, the same order of float operations, so every product has the bits of the int8 /
nibble copy's.

The kernels of every instruction selection are defined (tests compare them); only those of
the CPU's features compile and run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..jit.intrinsics import element_pointer
from ..jit.simd import SELECTIONS, for_selection, literal_strings, target_features
from . import wide_ir
from .formats import GGMLType
from .intdot import HOST_SIMD
from .kblocks_ir import (
    KIND_Q4_K,
    KIND_Q6_K,
    Q4K_BLOCK,
    Q6K_BLOCK,
    SUPER,
    kblock_pair_dots,
    prefetch_lines,
)
from .kblocks_wide_ir import wide_pair_dots
from .kquants import Q4_K, Q6_K

BLOCK_BYTES = {GGMLType.Q4_K: Q4K_BLOCK, GGMLType.Q6_K: Q6K_BLOCK}
FORMATS = {GGMLType.Q4_K: Q4_K, GGMLType.Q6_K: Q6_K}


@intrinsic(prefer_literal=True)
def super_pairs(typingctx, simd, kind, n_pairs, q, q0, q1, ints, int_scales, sums, n_super, out, ahead):
    """``super_pairs(simd, kind, n_pairs, q, q0, q1, ints, int_scales, sums, n_super, out,
    ahead)``: out[0], out[1] = the products of the rows of ``kind`` super-blocks ("q4_k" or
    "q6_k") at byte offsets q0 and q1 of ``q`` with one activation row (codes ``ints``, code
    scales and group sums per group), through selection ``simd``. ``simd`` "wide": both rows
    in 512-bit registers (kblocks_wide_ir.py); then ``n_pairs`` 2: out[0:4] = the rows at q0 +
    i * (q1 - q0), i < 4, two pairs sharing the activation's work. The first three are
    constants. ``ahead``: None, or the byte offset in ``q`` of a stretch the loop prefetches
    as it goes, as many bytes a super-block as it reads (kblocks_ir.prefetch_share; the
    stretch must lie inside ``q``)."""
    names = literal_strings(simd, kind)
    if names is None or not isinstance(n_pairs, types.IntegerLiteral):
        return None
    (selection, block_kind), pairs_wanted = names, n_pairs.literal_value
    sig = types.void(simd, kind, n_pairs, q, q0, q1, ints, int_scales, sums, n_super, out, ahead)
    prefetching = not isinstance(ahead, (types.NoneType, types.Omitted))

    def codegen(context, builder, signature, args):
        t, a = signature.args[3:], args[3:]  # the literals carry no value
        zero = ir.Constant(ir.IntType(64), 0)

        def pointer(i, index):
            return element_pointer(context, builder, t[i], a[i], index)

        rows = [pointer(0, a[1]), pointer(0, a[2])]
        activation = (pointer(3, zero), pointer(4, zero), pointer(5, zero), a[6])
        n_rows = 2 * pairs_wanted if selection == "wide" else 2
        stretch = (pointer(0, a[8]), prefetch_lines(block_kind, n_rows)) if prefetching else None
        if selection == "wide":
            stride = builder.sub(a[2], a[1])
            for i in range(2, 2 * pairs_wanted):
                at = builder.add(a[1], builder.mul(stride, ir.Constant(ir.IntType(64), i)))
                rows.append(pointer(0, at))
            pairs = [(rows[2 * p], rows[2 * p + 1]) for p in range(pairs_wanted)]
            dots = wide_pair_dots(builder, block_kind, pairs, *activation, stretch)
            totals = [v for pair in dots for v in pair]
        else:
            totals = kblock_pair_dots(builder, selection, block_kind, rows, *activation, stretch)
        for i, value in enumerate(totals):
            builder.store(value, pointer(7, ir.Constant(ir.IntType(64), i)))
        return context.get_dummy_value()

    return sig, codegen


class SuperPairs(NamedTuple):
    """One selection's pairs of Q4_K and Q6_K rows (signatures below); the ``_ahead`` ones take
    a last argument ``ahead``, the offset of a stretch of ``q`` to prefetch as they go."""

    q4k: Callable
    q6k: Callable
    q4k_ahead: Callable
    q6k_ahead: Callable


def _super_pairs(simd: str) -> SuperPairs:
    """dot_pair_q4k and dot_pair_q6k compiled for ``simd`` (a selection, or "wide")."""

    def dot_pair_q4k(q, q0, q1, ints, int_scales, sums, n_super, out):
        super_pairs(simd, KIND_Q4_K, 1, q, q0, q1, ints, int_scales, sums, n_super, out, None)

    def dot_pair_q6k(q, q0, q1, ints, int_scales, sums, n_super, out):
        super_pairs(simd, KIND_Q6_K, 1, q, q0, q1, ints, int_scales, sums, n_super, out, None)

    def dot_pair_q4k_ahead(q, q0, q1, ints, int_scales, sums, n_super, out, ahead):
        super_pairs(simd, KIND_Q4_K, 1, q, q0, q1, ints, int_scales, sums, n_super, out, ahead)

    def dot_pair_q6k_ahead(q, q0, q1, ints, int_scales, sums, n_super, out, ahead):
        super_pairs(simd, KIND_Q6_K, 1, q, q0, q1, ints, int_scales, sums, n_super, out, ahead)

    kernels = (dot_pair_q4k, dot_pair_q6k, dot_pair_q4k_ahead, dot_pair_q6k_ahead)
    return SuperPairs(*(for_selection(kernel, simd) for kernel in kernels))


@numba.njit(cache=True)
def wide_dot_quad_q4k(q, q0, q1, ints, int_scales, sums, n_super, out):
    """out[0:4] = the Q4_K rows at q0 + i * (q1 - q0), two 512-bit pairs (where wide_ir.fits)."""
    super_pairs("wide", KIND_Q4_K, 2, q, q0, q1, ints, int_scales, sums, n_super, out, None)


@numba.njit(cache=True)
def wide_dot_quad_q6k(q, q0, q1, ints, int_scales, sums, n_super, out):
    """out[0:4] = the Q6_K rows at q0 + i * (q1 - q0), two 512-bit pairs (where wide_ir.fits)."""
    super_pairs("wide", KIND_Q6_K, 2, q, q0, q1, ints, int_scales, sums, n_super, out, None)


@numba.njit(cache=True)
def wide_dot_quad_q4k_ahead(q, q0, q1, ints, int_scales, sums, n_super, out, ahead):
    """wide_dot_quad_q4k prefetching the stretch of ``q`` at byte ``ahead`` as it goes."""
    super_pairs("wide", KIND_Q4_K, 2, q, q0, q1, ints, int_scales, sums, n_super, out, ahead)


@numba.njit(cache=True)
def wide_dot_quad_q6k_ahead(q, q0, q1, ints, int_scales, sums, n_super, out, ahead):
    """wide_dot_quad_q6k prefetching the stretch of ``q`` at byte ``ahead`` as it goes."""
    super_pairs("wide", KIND_Q6_K, 2, q, q0, q1, ints, int_scales, sums, n_super, out, ahead)


# Each selection's (dot_pair_q4k, dot_pair_q6k)(q, q0, q1, ints, int_scales, sums, n_super,
# out): the super-blocks of two weight rows at byte offsets q0 and q1 of ``q`` (int8), one
# activation row's codes, code scales and group sums (per 32 for Q4_K, per 16 for Q6_K) ->
# out[0], out[1]: the bits of dot_pair_min (Q4_K's nibbles, offset 0) / dot_pair_int (Q6_K).
# The vnni selection runs the 512-bit pairs where the CPU has AVX-512 BW (AVX-VNNI alone: 256).
WIDE = wide_ir.fits(target_features())
NARROW = {simd: _super_pairs(simd) for simd in SELECTIONS}  # each selection's 256-bit pairs
WIDE_PAIRS = _super_pairs("wide")
SELECTED = {**NARROW, "vnni": WIDE_PAIRS} if WIDE else NARROW
dot_pair_q4k, dot_pair_q6k, dot_pair_q4k_ahead, dot_pair_q6k_ahead = SELECTED[HOST_SIMD]


@numba.njit(cache=True)
def _quad_of_pairs(q, q0, q1, ints, int_scales, sums, n_super, out, q4k):
    """Four rows q1 - q0 apart as two calls of the selection's pair (no 512-bit quad here)."""
    step = q1 - q0
    for p in range(2):
        a = q0 + 2 * p * step
        if q4k:
            dot_pair_q4k(q, a, a + step, ints, int_scales, sums, n_super, out[2 * p : 2 * p + 2])
        else:
            dot_pair_q6k(q, a, a + step, ints, int_scales, sums, n_super, out[2 * p : 2 * p + 2])


@numba.njit(cache=True)
def _quad_of_pairs_ahead(q, q0, q1, ints, int_scales, sums, n_super, out, ahead, q4k):
    """_quad_of_pairs, each pair prefetching its half of the stretch at ``ahead``."""
    step = q1 - q0
    for p in range(2):
        a, at = q0 + 2 * p * step, ahead + 2 * p * step
        if q4k:
            dot_pair_q4k_ahead(q, a, a + step, ints, int_scales, sums, n_super, out[2 * p : 2 * p + 2], at)
        else:
            dot_pair_q6k_ahead(q, a, a + step, ints, int_scales, sums, n_super, out[2 * p : 2 * p + 2], at)


@numba.njit(cache=True)
def pairs_dot_quad_q4k_ahead(q, q0, q1, ints, int_scales, sums, n_super, out, ahead):
    """dot_quad_q4k_ahead as two pairs (selections without the 512-bit quad)."""
    _quad_of_pairs_ahead(q, q0, q1, ints, int_scales, sums, n_super, out, ahead, True)


@numba.njit(cache=True)
def pairs_dot_quad_q6k_ahead(q, q0, q1, ints, int_scales, sums, n_super, out, ahead):
    """dot_quad_q6k_ahead as two pairs (selections without the 512-bit quad)."""
    _quad_of_pairs_ahead(q, q0, q1, ints, int_scales, sums, n_super, out, ahead, False)


@numba.njit(cache=True)
def pairs_dot_quad_q4k(q, q0, q1, ints, int_scales, sums, n_super, out):
    """dot_quad_q4k as two pairs (selections without the 512-bit quad)."""
    _quad_of_pairs(q, q0, q1, ints, int_scales, sums, n_super, out, True)


@numba.njit(cache=True)
def pairs_dot_quad_q6k(q, q0, q1, ints, int_scales, sums, n_super, out):
    """dot_quad_q6k as two pairs (selections without the 512-bit quad)."""
    _quad_of_pairs(q, q0, q1, ints, int_scales, sums, n_super, out, False)


# dot_quad_q4k / dot_quad_q6k(q, q0, q1, ints, int_scales, sums, n_super, out): out[0:4] = the
# rows at q0 + i * (q1 - q0): two 512-bit pairs in flight where the host runs them (each pair's
# FMA chain waits on its own last; two chains keep the FMA units busier), else two pairs.
# Only the host's variant is referenced, so no other CPU compiles AVX-512 code.
# At most the lines a quad's ``_ahead`` kernel prefetches a super-block (the 512-bit quad's
# four rows round up once, two pairs twice): its stretch spans n_super times this many lines.
STRETCH_LINES_Q4K, STRETCH_LINES_Q6K = 2 * prefetch_lines(KIND_Q4_K, 2), 2 * prefetch_lines(KIND_Q6_K, 2)
# dot_quad_q4k_ahead / dot_quad_q6k_ahead(..., out, ahead): the same, prefetching the stretch
# of ``q`` from byte ``ahead`` (four rows' worth: inside ``q``) a few lines a super-block.
if HOST_SIMD == "vnni" and WIDE:
    dot_quad_q4k, dot_quad_q6k = wide_dot_quad_q4k, wide_dot_quad_q6k
    dot_quad_q4k_ahead, dot_quad_q6k_ahead = wide_dot_quad_q4k_ahead, wide_dot_quad_q6k_ahead
else:
    dot_quad_q4k, dot_quad_q6k = pairs_dot_quad_q4k, pairs_dot_quad_q6k
    dot_quad_q4k_ahead, dot_quad_q6k_ahead = pairs_dot_quad_q4k_ahead, pairs_dot_quad_q6k_ahead


def super_row_bytes(qtype: GGMLType, cols: int) -> int:
    """Bytes of a row of ``cols`` weights in the file's super-blocks of ``qtype``."""
    return cols // SUPER * BLOCK_BYTES[qtype]


def dot_row_reference(qtype: GGMLType, blocks: np.ndarray, ints: np.ndarray, int_scales, sums) -> float:
    """numpy: one row of Q4_K / Q6_K file bytes (bytes,) against int8 activation codes (cols,)
    with per-group code scales and group sums -> float64 (within rounding of the kernels)."""
    fmt = FORMATS[qtype]
    unpacked = fmt.unpack(blocks.reshape(-1, BLOCK_BYTES[qtype]))
    group = fmt.group_size
    q = unpacked.q.reshape(-1).astype(np.int64)  # (cols,)
    lanes = (q * ints.astype(np.int64)).reshape(-1, group).sum(axis=1)  # (groups,)
    scales = unpacked.scales.reshape(-1).astype(np.float64)  # (groups,)
    total = (scales * int_scales.astype(np.float64) * lanes).sum()
    if unpacked.mins is not None:
        total += (unpacked.mins.reshape(-1).astype(np.float64) * sums.astype(np.float64)).sum()
    return float(total)
