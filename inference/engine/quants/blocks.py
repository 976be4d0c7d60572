"""Which file blocks a one-row product reads a matrix as (the linear table's QUINT field), and
Q8_0's own blocks.

A decode step streams every weight once, so it reads a matrix in the fewest bytes an exact
kernel takes: Q5_0 as 22-byte blocks (quint.py), Q4_1 as 20-byte blocks (q41.py), Q4_K and
Q6_K as the file's 144- and 210-byte super-blocks (kblocks.py), Q8_0 as the
file's 34-byte blocks (an f16 scale d and 32 int8 codes) where the int8 copy spends 36 (the
codes and a float32 scale), the output heads of all three models of the benchmarks. The
several-row tiles keep reading the arena's codes: the blocks are a second copy. The table
field holds the blocks' byte offset and their kind in one int64 (``encode``), -1 for none.
"""

from __future__ import annotations

import numba
import numpy as np

from ..jit.simd import SELECTIONS, for_selection
from .codes import Q41_BLOCK, Q80_BLOCK, QUINT_BLOCK
from .formats import Q4_1, Q5_0, Q8_0, BlockFormat
from .intdot import HOST_SIMD, group_dot_pair
from .kblocks_ir import Q4K_BLOCK, Q6K_BLOCK, SUPER
from .quint import WIDE, f16_exact
from .wide import PAIR
from .wide import Q8_0 as WIDE_Q8_0

GROUP = 32
BLOCK_Q5_0, BLOCK_Q4_1, BLOCK_Q8_0 = 0, 1, 2
BLOCK_Q4_K, BLOCK_Q6_K = 3, 4  # the file's super-blocks of 256 (kblocks.py)
KINDS = 8  # encode's multiplier
# The 32-weight kinds the arena rebuilds from the int8 codes (fused.py packs their rows).
FILE_FORMATS: dict[int, type[BlockFormat]] = {BLOCK_Q5_0: Q5_0, BLOCK_Q4_1: Q4_1, BLOCK_Q8_0: Q8_0}


def encode(offset: int, kind: int) -> int:
    """The table field of blocks of ``kind`` at byte ``offset`` of the q arena."""
    return offset * KINDS + kind


@numba.njit(cache=True)
def block_kind(field):
    """The kind of the blocks a table field >= 0 names."""
    return field % KINDS


@numba.njit(cache=True)
def block_offset(field):
    """The byte offset of the blocks a table field >= 0 names."""
    return field // KINDS


@numba.njit(cache=True)
def block_row_bytes(kind, cols):
    """Bytes of a row of ``cols`` weights in blocks of ``kind``."""
    if kind == BLOCK_Q4_K or kind == BLOCK_Q6_K:
        return cols // SUPER * (Q4K_BLOCK if kind == BLOCK_Q4_K else Q6K_BLOCK)
    per_block = QUINT_BLOCK if kind == BLOCK_Q5_0 else Q41_BLOCK if kind == BLOCK_Q4_1 else Q80_BLOCK
    return cols // GROUP * per_block


def q80_packable(q: np.ndarray, scales: np.ndarray, group_size: int) -> bool:
    """Whether int8 codes with float32 scales (rows, cols // 32) fit Q8_0 blocks exactly: groups
    of 32, scales an f16 holds bit for bit (any int8 code fits)."""
    return group_size == GROUP and q.size > 0 and f16_exact(scales)


def _q80_pair(simd: str):
    """dot_pair_q80 through selection ``simd``'s 256-bit instructions. q holds the blocks (as
    int8), q0/q1 byte offsets of the two rows; the scales array is taken and unused (each
    block carries its scale): dot_pair_int's signature otherwise."""

    def dot_pair_q80(q, q0, q1, ints, scales, int_scales, n_groups, out):
        group_dot_pair(simd, "q8_0_blocks", q, q0, q1, ints, scales, 0, 0, int_scales, n_groups, out)

    return for_selection(dot_pair_q80, simd)


_wide_pair = PAIR[WIDE_Q8_0]


@numba.njit(cache=True)
def wide_dot_pair_q80(q, q0, q1, ints, scales, int_scales, n_groups, out):
    """dot_pair_q80 with both rows in one 512-bit register (only where wide_ir.fits)."""
    _wide_pair(q, q0, q1, ints, int_scales, int_scales, n_groups, out)


# The vnni selection runs the 512-bit pair where the CPU has AVX-512 (AVX-VNNI alone: 256-bit).
NARROW = {simd: _q80_pair(simd) for simd in SELECTIONS}  # each selection's 256-bit pair
SELECTED = {**NARROW, "vnni": wide_dot_pair_q80} if WIDE else NARROW
# dot_pair_q80(q, q0, q1, ints, scales, int_scales, n_groups, out): the Q8_0 blocks of two
# weight rows at byte offsets q0 and q1 with one activation row -> out[0], out[1]: the int8
# copy's bits (dot_pair_int).
dot_pair_q80 = SELECTED[HOST_SIMD]
