"""The K-quant formats: 256-weight super-blocks with packed per-sub-block scales.

Each sub-block scale (and min) is ``super_scale * small_int``; that product is exact in
float32 (an 11-bit mantissa times an integer of at most 8 bits), so storing it premultiplied
loses nothing. Where the format subtracts a min, the unpacked ``mins`` hold its negation,
which keeps ``q * scale + min`` bitwise equal to the reference ``q * scale - min``.
"""

from __future__ import annotations

import numpy as np

from .formats import (
    BlockFormat,
    Field,
    GGMLType,
    Unpacked,
    bit_planes,
    crumbs,
    f16_field,
    nibbles,
)

QK_K = 256


def _two_bit_codes(qs: np.ndarray) -> np.ndarray:
    """64 bytes per block -> 256 2-bit codes: per half of 32 bytes, shifts 0, 2, 4, 6."""
    n = len(qs)
    return crumbs(qs.reshape(n, 2, 32)).reshape(n, QK_K)


def _low_nibble_codes(qs: np.ndarray) -> np.ndarray:
    """128 bytes per block -> 256 4-bit codes: per 32-byte chunk, low nibbles then high."""
    n = len(qs)
    return nibbles(qs.reshape(n, 4, 32)).reshape(n, QK_K)


def _six_bit_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12-byte field of Q4_K/Q5_K -> 8 six-bit scales and 8 six-bit mins (uint8)."""
    first, second, third = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate((first & 63, (third & 15) | ((first >> 6) << 4)), axis=1)
    mins = np.concatenate((second & 63, (third >> 4) | ((second >> 6) << 4)), axis=1)
    return scales, mins


def _super_scaled(super_scale: np.ndarray, small: np.ndarray) -> np.ndarray:
    """(n, 1) float32 times (n, k) small integers -> (n, k) float32, as the reference does."""
    return super_scale * small.astype(np.float32)


class Q2_K(BlockFormat, qtype=GGMLType.Q2_K):
    block_size, group_size, has_mins = QK_K, 16, True
    fields = (Field("scales", 16), Field("qs", 64), Field("d", 2), Field("dmin", 2))

    @classmethod
    def unpack(cls, blocks):
        f = cls.split(blocks)
        packed_scales = f["scales"]
        scales = _super_scaled(f16_field(f["d"]), packed_scales & 15)
        mins = -_super_scaled(f16_field(f["dmin"]), packed_scales >> 4)
        return Unpacked(_two_bit_codes(f["qs"]).view(np.int8), scales, mins)


class Q3_K(BlockFormat, qtype=GGMLType.Q3_K):
    block_size, group_size, has_mins = QK_K, 16, False
    fields = (Field("hmask", 32), Field("qs", 64), Field("scales", 12), Field("d", 2))

    @classmethod
    def unpack(cls, blocks):
        f = cls.split(blocks)
        n = len(blocks)
        # A clear high bit means "subtract 4": codes span -4..3.
        high_clear = 1 - bit_planes(np.ascontiguousarray(f["hmask"])).reshape(n, QK_K)
        q = _two_bit_codes(f["qs"]).view(np.int8) - (high_clear << 2).view(np.int8)
        packed = f["scales"]
        low4 = nibbles(packed[:, 0:8]).reshape(n, 16)
        high2 = crumbs(packed[:, 8:12]).reshape(n, 16)
        six_bit = (low4 | (high2 << 4)).astype(np.int8) - np.int8(32)
        return Unpacked(q, _super_scaled(f16_field(f["d"]), six_bit), None)


def _scales_and_mins(fields: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: per-group scales and (negated) mins from the 12 packed bytes of 6-bit values
    times the block's d and dmin."""
    six_scales, six_mins = _six_bit_scales_mins(fields["scales"])
    scales = _super_scaled(f16_field(fields["d"]), six_scales)
    mins = -_super_scaled(f16_field(fields["dmin"]), six_mins)
    return scales, mins


class Q4_K(BlockFormat, qtype=GGMLType.Q4_K):
    block_size, group_size, has_mins = QK_K, 32, True
    fields = (Field("d", 2), Field("dmin", 2), Field("scales", 12), Field("qs", 128))

    @classmethod
    def unpack(cls, blocks):
        f = cls.split(blocks)
        return Unpacked(_low_nibble_codes(f["qs"]).view(np.int8), *_scales_and_mins(f))


class Q5_K(BlockFormat, qtype=GGMLType.Q5_K):
    block_size, group_size, has_mins = QK_K, 32, True
    fields = (Field("d", 2), Field("dmin", 2), Field("scales", 12), Field("qh", 32), Field("qs", 128))

    @classmethod
    def unpack(cls, blocks):
        f = cls.split(blocks)
        n = len(blocks)
        # Sub-block g takes its fifth bit from bit g of each of the 32 qh bytes.
        fifth = bit_planes(np.ascontiguousarray(f["qh"])).reshape(n, QK_K)
        codes = _low_nibble_codes(f["qs"]) | (fifth << 4)
        return Unpacked(codes.view(np.int8), *_scales_and_mins(f))


class Q6_K(BlockFormat, qtype=GGMLType.Q6_K):
    block_size, group_size, has_mins = QK_K, 16, False
    fields = (Field("ql", 128), Field("qh", 64), Field("scales", 16), Field("d", 2))

    @classmethod
    def unpack(cls, blocks):
        f = cls.split(blocks)
        n = len(blocks)
        # Per 128-weight half: 64 ql bytes give low nibbles then high nibbles; 32 qh bytes give
        # the top two bits at shifts 0, 2, 4, 6 for consecutive runs of 32 weights.
        low = nibbles(f["ql"].reshape(n, 2, 64)).reshape(n, QK_K)
        high = crumbs(f["qh"].reshape(n, 2, 32)).reshape(n, QK_K)
        q = (low | (high << 4)).view(np.int8) - np.int8(32)
        sub_scales = np.ascontiguousarray(f["scales"]).view(np.int8)
        return Unpacked(q, _super_scaled(f16_field(f["d"]), sub_scales), None)
