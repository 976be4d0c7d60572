"""Block quantization formats as data, plus how each one unpacks into the common layout.

A quantized GGUF row is a run of fixed-size blocks, and every block is a fixed sequence of
named byte fields. Each format below declares those fields (their sizes must add up to the
``gguf`` package's type size, checked when the class is defined), how many weights share one
scale once unpacked (``group_size``), and an ``unpack`` that turns blocks into the layout the
kernels read::

    q       (n_blocks, block_size)       int8      small integers
    scales  (n_blocks, block_size // G)  float32
    mins    (n_blocks, block_size // G)  float32   (None for formats without an offset)

    weight = q * scale + min        (float32 multiply, then float32 add)

Scales and mins are computed in float32 exactly as ``gguf.quants`` does, so the weights the
kernels see are bit-for-bit the reference dequantization. This module holds the base class
and the 32-weight formats; ``kquants`` holds the 256-weight super-block formats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import gguf
import numpy as np

GGMLType = gguf.GGMLQuantizationType


@dataclass(frozen=True)
class Field:
    """A named run of bytes inside one block."""

    name: str
    nbytes: int


class Unpacked(NamedTuple):
    q: np.ndarray  # (n_blocks, block_size) int8
    scales: np.ndarray  # (n_blocks, block_size // group_size) float32
    mins: np.ndarray | None  # same shape as scales, or None


FORMATS: dict[GGMLType, type[BlockFormat]] = {}


class BlockFormat:
    """One block quantization format; subclasses are data plus an ``unpack``."""

    qtype: ClassVar[GGMLType]
    block_size: ClassVar[int]  # weights per block
    fields: ClassVar[tuple[Field, ...]]
    group_size: ClassVar[int]  # weights sharing one scale (and min) after unpacking
    has_mins: ClassVar[bool]

    def __init_subclass__(cls, qtype: GGMLType, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.qtype = qtype
        expected = gguf.GGML_QUANT_SIZES[qtype]
        if (cls.block_size, cls.type_size()) != expected:
            raise TypeError(
                f"{cls.__name__}: fields give {(cls.block_size, cls.type_size())}, gguf {expected}"
            )
        if cls.block_size % cls.group_size:
            raise TypeError(f"{cls.__name__}: group size must divide the block size")
        FORMATS[qtype] = cls

    @classmethod
    def type_size(cls) -> int:
        """Bytes per block."""
        return sum(field.nbytes for field in cls.fields)

    @classmethod
    def field_offset(cls, name: str) -> int:
        """Byte offset of field ``name`` inside a block."""
        start = 0
        for field in cls.fields:
            if field.name == name:
                return start
            start += field.nbytes
        raise KeyError(f"{cls.__name__} has no field {name!r}")

    @classmethod
    def split(cls, blocks: np.ndarray) -> dict[str, np.ndarray]:
        """Column views of ``blocks`` (n_blocks, type_size) uint8, one per field."""
        views, start = {}, 0
        for field in cls.fields:
            views[field.name] = blocks[:, start : start + field.nbytes]
            start += field.nbytes
        return views

    @classmethod
    def join(cls, values: dict[str, np.ndarray]) -> np.ndarray:
        """``split`` undone: one (n_blocks, nbytes) uint8 array per field -> blocks."""
        first = values[cls.fields[0].name]
        blocks = np.empty((len(first), cls.type_size()), np.uint8)  # (n_blocks, type_size)
        start = 0
        for field in cls.fields:
            blocks[:, start : start + field.nbytes] = values[field.name]
            start += field.nbytes
        return blocks

    @classmethod
    def unpack(cls, blocks: np.ndarray) -> Unpacked:
        """Blocks (n_blocks, type_size) uint8 -> int8 values, float32 scales (and mins)."""
        raise NotImplementedError

    @classmethod
    def pack(cls, unpacked: Unpacked) -> np.ndarray:
        """``unpack`` undone: values, scales (and mins) -> blocks (n_blocks, type_size) uint8.
        Exact when the scales (and mins) are f16 values and the codes in the format's range."""
        raise NotImplementedError(f"{cls.__name__} is read from files only")

    @classmethod
    def unpack_rows(cls, rows: np.ndarray) -> Unpacked:
        """Rows of blocks (n_rows, bytes) uint8 -> values (n_rows, cols), scales and mins
        (n_rows, cols // group_size)."""
        n_rows = rows.shape[0]
        blocks = np.ascontiguousarray(rows).reshape(-1, cls.type_size())  # (n_blocks, type_size)
        q, scales, mins = cls.unpack(blocks)
        return Unpacked(
            q.reshape(n_rows, -1),
            scales.reshape(n_rows, -1),
            None if mins is None else mins.reshape(n_rows, -1),
        )

    @classmethod
    def pack_rows(cls, q: np.ndarray, scales: np.ndarray, mins: np.ndarray | None = None) -> np.ndarray:
        """``unpack_rows`` undone: values (n_rows, cols), scales (and mins) (n_rows, groups)
        -> rows of blocks (n_rows, cols // block_size * type_size) uint8."""
        n_rows, cols = q.shape
        n_blocks = n_rows * (cols // cls.block_size)
        per_block = cls.block_size // cls.group_size
        blocks = cls.pack(
            Unpacked(
                q.reshape(n_blocks, cls.block_size),
                scales.reshape(n_blocks, per_block),
                None if mins is None else mins.reshape(n_blocks, per_block),
            )
        )  # (n_blocks, type_size)
        return blocks.reshape(n_rows, -1)


# ---- bit helpers shared by all formats (vectorized over blocks) ----


def f16_field(field: np.ndarray) -> np.ndarray:
    """A 2-byte field (n, 2) uint8 holding a little-endian float16 -> (n, 1) float32."""
    return field.view("<f2").astype(np.float32)


def nibbles(packed: np.ndarray) -> np.ndarray:
    """(..., k) uint8 -> (..., 2, k): all low nibbles, then all high nibbles."""
    return np.stack((packed & 0x0F, packed >> 4), axis=-2)


def crumbs(packed: np.ndarray) -> np.ndarray:
    """(..., k) uint8 -> (..., 4, k): the 2-bit fields at shifts 0, 2, 4, 6."""
    return np.stack((packed & 3, (packed >> 2) & 3, (packed >> 4) & 3, packed >> 6), axis=-2)


def bits_lsb_first(packed: np.ndarray) -> np.ndarray:
    """(n, k) uint8 -> (n, 8 * k): bit i of the little-endian bit string at position i."""
    return np.unpackbits(packed, axis=-1, bitorder="little")


def bit_planes(packed: np.ndarray) -> np.ndarray:
    """(n, k) uint8 -> (n, 8, k): plane p holds bit p of every byte."""
    n, k = packed.shape
    return bits_lsb_first(packed).reshape(n, k, 8).transpose(0, 2, 1)


def _offset_q(codes: np.ndarray, offset: int) -> np.ndarray:
    """uint8 codes -> int8 ``code - offset``; uint8 wrap-around then an int8 view is exact."""
    return (codes - np.uint8(offset)).view(np.int8)


# ---- their inverses, for pack ----


def f16_bytes(values: np.ndarray) -> np.ndarray:
    """f16_field undone: (n, 1) float32 -> (n, 2) uint8, a little-endian float16."""
    return np.ascontiguousarray(values, dtype="<f2").reshape(-1, 1).view(np.uint8)


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """nibbles undone: (n, 2k) codes 0..15 -> (n, k) uint8, code j low and code j + k high."""
    k = codes.shape[-1] // 2
    return (codes[..., :k] & 0x0F) | ((codes[..., k:] & 0x0F) << 4)


def pack_bits_lsb_first(bits: np.ndarray) -> np.ndarray:
    """bits_lsb_first undone: (n, 8k) of 0/1 -> (n, k) uint8."""
    return np.packbits(bits.astype(np.uint8), axis=-1, bitorder="little")


# ---- the 32-weight formats ----


class Q4_0(BlockFormat, qtype=GGMLType.Q4_0):
    block_size, group_size, has_mins = 32, 32, False
    fields = (Field("d", 2), Field("qs", 16))

    @classmethod
    def unpack(cls, blocks):
        f = cls.split(blocks)
        codes = nibbles(f["qs"]).reshape(len(blocks), 32)
        return Unpacked(_offset_q(codes, 8), f16_field(f["d"]), None)


class Q4_1(BlockFormat, qtype=GGMLType.Q4_1):
    block_size, group_size, has_mins = 32, 32, True
    fields = (Field("d", 2), Field("m", 2), Field("qs", 16))

    @classmethod
    def unpack(cls, blocks):
        f = cls.split(blocks)
        codes = nibbles(f["qs"]).reshape(len(blocks), 32)
        return Unpacked(codes.view(np.int8), f16_field(f["d"]), f16_field(f["m"]))

    @classmethod
    def pack(cls, unpacked):
        codes = unpacked.q.view(np.uint8)  # (n, 32) 0..15
        d, m = f16_bytes(unpacked.scales), f16_bytes(unpacked.mins)
        return cls.join({"d": d, "m": m, "qs": pack_nibbles(codes)})


def _five_bit_codes(f: dict[str, np.ndarray], n_blocks: int) -> np.ndarray:
    """Low nibbles from ``qs`` plus the fifth bit from the 32-bit ``qh`` -> (n, 32) uint8."""
    low = nibbles(f["qs"]).reshape(n_blocks, 32)
    return low | (bits_lsb_first(np.ascontiguousarray(f["qh"])) << 4)


class Q5_0(BlockFormat, qtype=GGMLType.Q5_0):
    block_size, group_size, has_mins = 32, 32, False
    fields = (Field("d", 2), Field("qh", 4), Field("qs", 16))

    @classmethod
    def unpack(cls, blocks):
        f = cls.split(blocks)
        return Unpacked(_offset_q(_five_bit_codes(f, len(blocks)), 16), f16_field(f["d"]), None)

    @classmethod
    def pack(cls, unpacked):
        codes = unpacked.q.view(np.uint8) + np.uint8(16)  # (n, 32) 0..31, wrapping back
        qh = pack_bits_lsb_first(codes >> 4)  # (n, 4)
        return cls.join({"d": f16_bytes(unpacked.scales), "qh": qh, "qs": pack_nibbles(codes)})


class Q5_1(BlockFormat, qtype=GGMLType.Q5_1):
    block_size, group_size, has_mins = 32, 32, True
    fields = (Field("d", 2), Field("m", 2), Field("qh", 4), Field("qs", 16))

    @classmethod
    def unpack(cls, blocks):
        f = cls.split(blocks)
        codes = _five_bit_codes(f, len(blocks))
        return Unpacked(codes.view(np.int8), f16_field(f["d"]), f16_field(f["m"]))


class Q8_0(BlockFormat, qtype=GGMLType.Q8_0):
    block_size, group_size, has_mins = 32, 32, False
    fields = (Field("d", 2), Field("qs", 32))

    @classmethod
    def unpack(cls, blocks):
        f = cls.split(blocks)
        return Unpacked(np.ascontiguousarray(f["qs"]).view(np.int8), f16_field(f["d"]), None)

    @classmethod
    def pack(cls, unpacked):
        return cls.join({"d": f16_bytes(unpacked.scales), "qs": unpacked.q.view(np.uint8)})
