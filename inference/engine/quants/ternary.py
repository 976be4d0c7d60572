"""The ternary formats TQ1_0 and TQ2_0: 256 weights of -1, 0 or +1 times one f16 scale.

Ternary models (BitNet b1.58, Ternary-Bonsai) ship them. TQ2_0 spends two bits a weight, TQ1_0
packs five trits in a byte (1.6875 bits a weight). Unpacked, a weight is the int8 ``t - 1``
(``t`` in 0..2 as stored) times the block's scale, the float32 product ggml's dequantization
forms, so the values are bitwise ``gguf.quants``'. The scale is repeated per group of 32: the
kernels read groups of 16 or 32.
"""

from __future__ import annotations

import numpy as np

from .formats import BlockFormat, Field, GGMLType, Unpacked, crumbs, f16_field

QK_K = 256
GROUP = 32
# The trits of a byte b (its value in base 3, most significant trit first) come out as
# fixed-point fractions: the n-th is ((b * 3**n mod 256) * 3) >> 8.
POWERS_OF_THREE = np.array([1, 3, 9, 27, 81], np.uint8)


def _trits(packed: np.ndarray, count: int) -> np.ndarray:
    """(n, k) uint8 -> (n, count, k) uint8 trits 0..2: the first ``count`` of each byte."""
    shifted = packed[:, None, :] * POWERS_OF_THREE[:count, None]  # (n, count, k), mod 256
    return ((shifted.astype(np.uint16) * 3) >> 8).astype(np.uint8)


def _ternary(trits: np.ndarray, d: np.ndarray) -> Unpacked:
    """Trits (n, 256) in 0..2 and block scales (n, 1) -> the common layout."""
    q = trits.astype(np.int8) - np.int8(1)  # (n, 256)
    scales = np.repeat(d, QK_K // GROUP, axis=1)  # (n, 8)
    return Unpacked(q, scales, None)


class TQ1_0(BlockFormat, qtype=GGMLType.TQ1_0):
    block_size, group_size, has_mins = QK_K, GROUP, False
    fields = (Field("qs", 48), Field("qh", 4), Field("d", 2))

    @classmethod
    def unpack(cls, blocks):
        f = cls.split(blocks)
        n = len(blocks)
        qs, qh = np.ascontiguousarray(f["qs"]), np.ascontiguousarray(f["qh"])
        # Five trits from each of the first 32 bytes, then from the next 16, then four from
        # each of qh's 4 bytes: 160 + 80 + 16 weights, each run trit-major.
        runs = (_trits(qs[:, :32], 5), _trits(qs[:, 32:], 5), _trits(qh, 4))
        trits = np.concatenate([run.reshape(n, -1) for run in runs], axis=1)  # (n, 256)
        return _ternary(trits, f16_field(f["d"]))


class TQ2_0(BlockFormat, qtype=GGMLType.TQ2_0):
    block_size, group_size, has_mins = QK_K, GROUP, False
    fields = (Field("qs", 64), Field("d", 2))

    @classmethod
    def unpack(cls, blocks):
        f = cls.split(blocks)
        n = len(blocks)
        # Per 32-byte half: the 2-bit fields at shifts 0, 2, 4, 6, each a run of 32 weights.
        trits = crumbs(f["qs"].reshape(n, 2, 32)).reshape(n, QK_K)
        return _ternary(trits, f16_field(f["d"]))
