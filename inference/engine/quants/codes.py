"""How a weight group's codes sit in memory, as the integer dot products read them.

The integer kernels (intdot_ir.py, tile_ir.py) multiply one group of 16 or 32 weight codes
with int8 activation codes at a time. The codes come in one of these layouts:

| layout | codes | scale (and min) | bytes a group |
|---|---|---|---|
| ``int8_16``, ``int8_32`` | one int8 a byte (layout.py's copy) | the arena's float32 scales | 16, 32 |
| ``nibbles`` | 4-bit codes 0..15, two a byte (nibbles.py) | the arena's | 16 |
| ``nibbles_8`` | the same, stored plus 8 (Q4_0) | the arena's | 16 |
| ``q5_0_blocks`` | the file's Q5_0 block: nibbles + fifth bits, stored plus 16 | f16 d in the block | 22 |
| ``q4_1_blocks`` | the file's Q4_1 block: nibbles 0..15 | f16 d and m in the block | 20 |
| ``q8_0_blocks`` | the file's Q8_0 block: int8 codes | f16 d in the block | 34 |

Byte offsets inside a file block come from its BlockFormat (formats.py). Every layout yields
the same integer lanes for the same codes, so the same bits: only the bytes read differ.

``tag`` is the value the fused forward passes at run time (the ``nib`` argument of the tile
and pair kernels) to choose a layout among those its group shift allows: -1 for int8 codes,
the offset for packed nibbles, and a marker of its own for each file block.
"""

from __future__ import annotations

from dataclasses import dataclass

from .formats import Q4_1, Q5_0, Q8_0, BlockFormat


@dataclass(frozen=True)
class GroupCodes:
    """One layout of a weight group's codes (module docstring)."""

    name: str
    tag: int  # the run-time value that selects this layout
    group: int  # weights per group: 16 or 32
    stride: int  # bytes from one group (or block) to the next
    packed: bool  # 4-bit codes two a byte: byte j holds code j low, code j + 16 high
    offset: int  # what the stored codes are plus (0: as they are)
    block: type[BlockFormat] | None = None  # the file's block, its scale (and min) inside

    @property
    def codes_at(self) -> int:
        """Byte offset of the codes inside a group's bytes."""
        return self.block.field_offset("qs") if self.block else 0

    @property
    def fifth_bits_at(self) -> int:
        """Byte offset of Q5_0's 32 fifth bits (a little-endian uint32) inside its block."""
        return self.block.field_offset("qh")

    @property
    def five_bit(self) -> bool:
        """Codes 0..31: packed nibbles plus a fifth bit per code (Q5_0)."""
        return self.block is Q5_0

    @property
    def unsigned(self) -> bool:
        """Codes 0..15 stored as they are: their own magnitudes (no sign to move)."""
        return self.packed and self.offset == 0 and not self.five_bit

    @property
    def block_min(self) -> bool:
        """The group's min is in its block, after the scale (Q4_1)."""
        return self.block is Q4_1


INT8_16 = GroupCodes("int8_16", tag=-1, group=16, stride=16, packed=False, offset=0)
INT8_32 = GroupCodes("int8_32", tag=-1, group=32, stride=32, packed=False, offset=0)
NIBBLES = GroupCodes("nibbles", tag=0, group=32, stride=16, packed=True, offset=0)
NIBBLES_8 = GroupCodes("nibbles_8", tag=8, group=32, stride=16, packed=True, offset=8)
Q5_0_BLOCKS = GroupCodes(
    "q5_0_blocks", tag=16, group=32, stride=Q5_0.type_size(), packed=True, offset=16, block=Q5_0
)
Q4_1_BLOCKS = GroupCodes(
    "q4_1_blocks", tag=41, group=32, stride=Q4_1.type_size(), packed=True, offset=0, block=Q4_1
)
Q8_0_BLOCKS = GroupCodes(
    "q8_0_blocks", tag=80, group=32, stride=Q8_0.type_size(), packed=False, offset=0, block=Q8_0
)
LAYOUTS = {
    codes.name: codes
    for codes in (INT8_16, INT8_32, NIBBLES, NIBBLES_8, Q5_0_BLOCKS, Q4_1_BLOCKS, Q8_0_BLOCKS)
}
# The file blocks' facts as plain ints, for the numba kernels that compare a run-time tag or
# read the blocks' bytes themselves.
Q5_0_TAG, Q4_1_TAG, Q8_0_TAG = Q5_0_BLOCKS.tag, Q4_1_BLOCKS.tag, Q8_0_BLOCKS.tag
QUINT_BLOCK, QUINT_QS, QUINT_QH = Q5_0_BLOCKS.stride, Q5_0_BLOCKS.codes_at, Q5_0_BLOCKS.fifth_bits_at
Q41_BLOCK, Q41_QS = Q4_1_BLOCKS.stride, Q4_1_BLOCKS.codes_at
Q80_BLOCK, Q80_QS = Q8_0_BLOCKS.stride, Q8_0_BLOCKS.codes_at
