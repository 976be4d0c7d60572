"""Integer group dot products over 4-bit weight codes packed two a byte, as the file packs them.

The int8 layout (layout.py) spends a byte on every weight; a decode step, which reads every
weight once per token, then moves 1.25 bytes per Q4_1 weight (int8 code + float32 scale and
min per 32) where the file holds 0.625. Formats whose codes fit in four bits (Q4_0, Q4_1,
Q4_K, groups of 32) are kept here as nibbles instead: byte j of a group holds code j in its
low and code j + 16 in its high nibble (Q4_0's own order; Q4_K's 64-weight runs are
reordered once at load), and the vector kernel unpacks them in registers (intdot_ir.py). The
unpacked integer lanes are those of the int8 copy, so every product has the same bits; only
the bytes read per weight halve. Q4_0's codes are stored plus 8 (``NIBBLE_OFFSET``) and the
kernel subtracts it.

The functions mirror intdot.py's ``dot_row_int``, ``dot_rows_int`` and ``dot_pair_int`` with
``offset`` (0 or 8) in place of the group shift (groups are 32 weights).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..jit.simd import SELECTIONS, for_selection
from .codes import NIBBLES_8
from .intdot import HOST_SIMD, IntDots, group_dot, group_dot_pair, group_dot_rows
from .layout import GroupArrays, GroupLayout

GROUP = 32
NIBBLE_OFFSET = NIBBLES_8.offset  # codes -8..7 are stored as 0..15


def packable_offset(q: np.ndarray, group_size: int) -> int | None:
    """The offset under which int8 codes ``q`` fit in nibbles (0 for 0..15, 8 for -8..7), or
    None when they do not or groups are not 32 wide."""
    if group_size != GROUP or q.size == 0:
        return None
    low, high = int(q.min()), int(q.max())
    if 0 <= low and high <= 15:
        return 0
    if -NIBBLE_OFFSET <= low and high <= 15 - NIBBLE_OFFSET:
        return NIBBLE_OFFSET
    return None


def pack_nibbles(q: np.ndarray, offset: int) -> np.ndarray:
    """int8 codes (rows, cols) -> packed bytes (rows, cols // 2) uint8: per group of 32, byte
    j = (code j + offset) | (code j + 16 + offset) << 4."""
    rows, cols = q.shape
    codes = (q.astype(np.int16) + offset).astype(np.uint8).reshape(rows, cols // GROUP, 2, GROUP // 2)
    return (codes[:, :, 0] | (codes[:, :, 1] << 4)).reshape(rows, cols // 2)


def unpack_nibbles(packed: np.ndarray, offset: int) -> np.ndarray:
    """pack_nibbles undone: (rows, cols // 2) uint8 -> int8 codes (rows, cols)."""
    rows, half = packed.shape
    groups = packed.reshape(rows, half * 2 // GROUP, 1, GROUP // 2)
    codes = np.concatenate([groups & 0x0F, groups >> 4], axis=2).astype(np.int16) - offset
    return codes.astype(np.int8).reshape(rows, half * 2)


@dataclass(frozen=True)
class NibbleLayout(GroupArrays):
    """A layout whose 4-bit codes are held only as packed nibbles (the fused step's arena): the
    int8 ``q`` is unpacked when read, for the numpy products, training's dequantization and
    the tests, so a byte a weight is not kept resident beside the half byte the kernels read."""

    packed: np.ndarray  # (rows, cols // 2) uint8
    offset: int
    scales: np.ndarray  # (rows, cols // 32) float32
    mins: np.ndarray | None  # (rows, cols // 32) float32, or None
    group_size: int = GROUP

    @property
    def q(self) -> np.ndarray:
        return unpack_nibbles(self.packed, self.offset)  # (rows, cols) int8

    @property
    def code_bytes(self) -> int:
        return self.packed.nbytes

    def subset(self, row_ids: np.ndarray) -> GroupLayout:
        """Rows ``row_ids`` as an int8 GroupLayout, unpacking only those rows (a lookup)."""
        mins = None if self.mins is None else self.mins[row_ids]
        q = unpack_nibbles(self.packed[row_ids], self.offset)  # (k, cols) int8
        return GroupLayout(q, self.scales[row_ids], mins, self.group_size)


def _nibble_dots(simd: str) -> IntDots:
    """intdot's three kernels over packed nibbles stored plus ``offset`` (0 or 8), compiled
    for selection ``simd``."""

    def dot_row_nib(q, q_start, ints, scales, s_start, int_scales, n_groups, offset):
        if offset == 0:
            return group_dot(simd, "nibbles", q, q_start, ints, scales, s_start, int_scales, n_groups)
        return group_dot(simd, "nibbles_8", q, q_start, ints, scales, s_start, int_scales, n_groups)

    def dot_rows_nib(q, q_start, ints, n0, scales, s_start, int_scales, n_groups, offset, out):
        if offset == 0:
            group_dot_rows(simd, "nibbles", q, q_start, ints, n0, scales, s_start, int_scales, n_groups, out)
        else:
            group_dot_rows(
                simd, "nibbles_8", q, q_start, ints, n0, scales, s_start, int_scales, n_groups, out
            )

    def dot_pair_nib(q, q_start, q_next, ints, scales, s_start, s_next, int_scales, n_groups, offset, out):
        if offset == 0:
            group_dot_pair(
                simd, "nibbles", q, q_start, q_next, ints, scales, s_start, s_next, int_scales, n_groups, out
            )
        else:
            group_dot_pair(
                simd,
                "nibbles_8",
                q,
                q_start,
                q_next,
                ints,
                scales,
                s_start,
                s_next,
                int_scales,
                n_groups,
                out,
            )

    return IntDots(
        for_selection(dot_row_nib, simd),
        for_selection(dot_rows_nib, simd),
        for_selection(dot_pair_nib, simd),
    )


SELECTED = {simd: _nibble_dots(simd) for simd in SELECTIONS}
# The host's selection (all give the same bits); q holds packed bytes (as int8), q_start and
# q_next are byte offsets: a row of cols weights is cols // 2 bytes.
dot_row_nib, dot_rows_nib, dot_pair_nib = SELECTED[HOST_SIMD]
