"""Integer group dot products over Q5_0 weights read as the file packs them (five bits a code).

A decode step reads every weight once per token and is bound by memory bandwidth. The int8
layout (layout.py) spends 32 bytes of codes and a 4-byte scale on every 32 Q5_0 weights where
the file spends 22: an f16 scale ``d``, the fifth bits of the 32 codes as a little-endian
uint32 ``qh`` (bit j: code j) and 16 bytes ``qs`` of nibbles (byte j: code j low, code j + 16
high). Qwen2.5-Coder-0.5B keeps 133 of its 170 matrices in Q5_0: ~250M weights per token.
A decode step keeps those blocks byte for byte (fused.py) and the vector kernel
(intdot_ir.py, codes.py ``q5_0_blocks``; wide_ir.py) unpacks them in registers: the same integer
lanes and the same float32 scale (an f16 widens exactly), so every product has the bits of
the int8 copy's, from 0.69 bytes a weight instead of 1.125.

The blocks are rebuilt from the int8 codes and scales (formats.Q5_0.pack_rows): a Q5_0 file's own bytes,
and any matrix whose codes are -16..15 in groups of 32 with f16-exact scales.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numba
import numpy as np

from ..jit.simd import SELECTIONS, for_selection, target_features
from . import wide, wide_ir
from .codes import Q5_0_BLOCKS, QUINT_BLOCK
from .formats import Q5_0
from .intdot import HOST_SIMD, group_dot, group_dot_pair

GROUP = 32
QUINT_OFFSET = Q5_0_BLOCKS.offset  # codes -16..15 are stored as 0..31
# Whether the one-row products read Q5_0 matrices as blocks (a second copy beside the int8
# codes the tiles read). Two threads streaming 151936x896 (bench/lab/q5_stream.py): the 512-bit
# pair reads the blocks 1.0-1.56x as fast as the int8 copy (the more the memory bus is shared,
# the more); the avx2 selection's 256-bit unpack is instruction-bound below the int8 copy
# (21-22 against 26 Gweights/s), so the other selections keep that.
DECODE_BLOCKS = HOST_SIMD == "vnni" and wide_ir.fits(target_features())


def f16_exact(values: np.ndarray) -> bool:
    """Whether an f16 holds every one of ``values`` (float32) bit for bit: a file block's
    scale (and min) can then stand for them."""
    with np.errstate(over="ignore"):
        return bool(np.array_equal(values.astype(np.float16).astype(np.float32), values, equal_nan=True))


def quint_packable(q: np.ndarray, scales: np.ndarray, group_size: int) -> bool:
    """Whether int8 codes ``q`` (rows, cols) with float32 ``scales`` (rows, cols // 32) fit Q5_0
    blocks exactly: groups of 32, codes -16..15, scales an f16 holds bit for bit."""
    if group_size != GROUP or q.size == 0 or int(q.min()) < -QUINT_OFFSET or int(q.max()) >= QUINT_OFFSET:
        return False
    return f16_exact(scales)


@numba.njit(cache=True)
def quint_row_bytes(cols):
    """Bytes of a row of ``cols`` weights in Q5_0 blocks."""
    return cols // GROUP * QUINT_BLOCK


def dot_row_quint_reference(blocks: np.ndarray, ints: np.ndarray, int_scales: np.ndarray) -> float:
    """numpy: one row of Q5_0 blocks (bytes,) against int8 activation codes (cols,) with their
    per-group scales -> float64 (within rounding of the kernels' float32)."""
    q, d, _ = Q5_0.unpack_rows(blocks[None, :])
    sums = (q[0].astype(np.int64) * ints.astype(np.int64)).reshape(-1, GROUP).sum(axis=1)  # (groups,)
    return float((d[0].astype(np.float64) * int_scales.astype(np.float64) * sums).sum())


class QuintDots(NamedTuple):
    """One selection's products over Q5_0 blocks (signatures at the end of the module)."""

    row: Callable
    pair: Callable


def _quint_dots(simd: str) -> QuintDots:
    """dot_row_quint and dot_pair_quint through selection ``simd``'s 256-bit instructions. q
    holds the blocks (as int8), q_start a byte offset; the scales array and s_start of the
    intdot signatures are taken and unused (each block carries its scale), so the call sites
    stay those of dot_row_int / dot_pair_int."""

    def dot_row_quint(q, q_start, ints, scales, s_start, int_scales, n_groups):
        return group_dot(simd, "q5_0_blocks", q, q_start, ints, scales, s_start, int_scales, n_groups)

    def dot_pair_quint(q, q_start, q_next, ints, scales, s_start, s_next, int_scales, n_groups, out):
        group_dot_pair(
            simd, "q5_0_blocks", q, q_start, q_next, ints, scales, s_start, s_next, int_scales, n_groups, out
        )

    return QuintDots(for_selection(dot_row_quint, simd), for_selection(dot_pair_quint, simd))


_wide_pair, _wide_quad = wide.PAIR[wide.Q5_0], wide.QUAD[wide.Q5_0]


@numba.njit(cache=True)
def wide_dot_pair_quint(q, q_start, q_next, ints, scales, s_start, s_next, int_scales, n_groups, out):
    """dot_pair_quint with both rows in one 512-bit register (only where wide_ir.fits)."""
    _wide_pair(q, q_start, q_next, ints, int_scales, int_scales, n_groups, out)


@numba.njit(cache=True)
def wide_dot_quad_quint(q, q_start, q_next, ints, scales, s_start, s_next, int_scales, n_groups, out):
    """out[0:4] = the products of four rows q_next - q_start bytes apart, two 512-bit pairs
    sharing the activation's work (only where wide_ir.fits)."""
    _wide_quad(q, q_start, q_next, ints, int_scales, int_scales, n_groups, out)


# Each selection's (dot_row_quint, dot_pair_quint); all give the int8 copy's bits. The vnni
# selection runs the 512-bit pair where the CPU has AVX-512 (AVX-VNNI alone: 256-bit).
WIDE = wide_ir.fits(target_features())
NARROW = {simd: _quint_dots(simd) for simd in SELECTIONS}  # each selection's 256-bit kernels
SELECTED = {**NARROW, "vnni": NARROW["vnni"]._replace(pair=wide_dot_pair_quint)} if WIDE else NARROW
dot_row_quint, dot_pair_quint = SELECTED[HOST_SIMD]
