"""Integer group dot products over Q4_1 weights read as the file packs them (20-byte blocks).

A decode step reads every weight once per token and is bound by memory bandwidth. The nibble
layout (nibbles.py) keeps a Q4_1 matrix as three streams: 16 bytes of packed codes, a float32
scale and a float32 min per 32 weights (24 bytes). The file spends 20: an f16 scale ``d``, an
f16 min ``m`` and the same 16 bytes of nibbles (byte j: code j low, code j + 16 high). A
decode step keeps those blocks (fused.py, a second copy beside the nibbles the tiles of
several rows read) and the vector kernel (intdot_ir.py, codes.py ``q4_1_blocks``) widens d and m from
one 4-byte load: the same integer lanes, the same float32 scale and min (an f16 widens
exactly), the same min-term chain (pair_mins.py), so every product has the nibbles' bits, from
one stream of 0.625 bytes a weight instead of three of 0.75. SmolLM2-135M keeps 210 of its
211 matrices in Q4_1.

The blocks are rebuilt from the int8 codes, scales and mins (formats.Q4_1.pack_rows): a Q4_1 file's own
bytes, and any matrix whose codes are 0..15 in groups of 32 with f16-exact scales and mins.
"""

from __future__ import annotations

import numba
import numpy as np

from ..jit.simd import SELECTIONS, for_selection
from .codes import Q41_BLOCK
from .intdot import HOST_SIMD
from .pair_mins import group_dot_pair_min
from .quint import WIDE, f16_exact
from .wide import PAIR, Q4_1

GROUP = 32


def q41_packable(q: np.ndarray, scales: np.ndarray, mins: np.ndarray | None, group_size: int) -> bool:
    """Whether int8 codes ``q`` (rows, cols) with float32 ``scales`` and ``mins`` (rows, cols //
    32) fit Q4_1 blocks exactly: groups of 32, codes 0..15, scales and mins an f16 holds."""
    if mins is None or group_size != GROUP or q.size == 0 or int(q.min()) < 0 or int(q.max()) > 15:
        return False
    return f16_exact(scales) and f16_exact(mins)


@numba.njit(cache=True)
def q41_row_bytes(cols):
    """Bytes of a row of ``cols`` weights in Q4_1 blocks."""
    return cols // GROUP * Q41_BLOCK


def _q41_pair(simd: str):
    """dot_pair_q41 through selection ``simd``'s 256-bit instructions. q holds the blocks (as
    int8), q0/q1 byte offsets of the two rows; scales and mins are taken and unused (each
    block carries its own): pair_mins' signature otherwise."""

    def dot_pair_q41(q, q0, q1, ints, scales, int_scales, mins, sums, n_groups, out):
        group_dot_pair_min(
            simd, "q4_1_blocks", q, q0, q1, ints, scales, 0, 0, int_scales, mins, 0, 0, sums, n_groups, out
        )

    return for_selection(dot_pair_q41, simd)


_wide_pair = PAIR[Q4_1]


@numba.njit(cache=True)
def wide_dot_pair_q41(q, q0, q1, ints, scales, int_scales, mins, sums, n_groups, out):
    """dot_pair_q41 with both rows in one 512-bit register (only where wide_ir.fits)."""
    _wide_pair(q, q0, q1, ints, int_scales, sums, n_groups, out)


# The vnni selection runs the 512-bit pair where the CPU has AVX-512 (AVX-VNNI alone: 256-bit).
NARROW = {simd: _q41_pair(simd) for simd in SELECTIONS}  # each selection's 256-bit pair
SELECTED = {**NARROW, "vnni": wide_dot_pair_q41} if WIDE else NARROW
# dot_pair_q41(q, q0, q1, ints, scales, int_scales, mins, sums, n_groups, out): the Q4_1 blocks
# of two weight rows at byte offsets q0 and q1, one activation row's codes, code scales and
# group sums -> out[0], out[1], each with its min term: dot_pair_min's bits.
dot_pair_q41 = SELECTED[HOST_SIMD]
