"""A tile of a blocks-only matrix's rows unpacked from the file's blocks into the int8 codes and
float32 group scales (and mins) the several-row tiles read (prefill_tiles.py).

A matrix in a format of quants/matrix.BLOCK_NATIVE_TYPES is held once, as the file packs it: the
one-row products read the blocks in registers (quants/blocks.py), and a product of several
token rows unpacks TILE rows at a time into a thread's scratch, then runs the register tiles
on them. The unpacked values are those ``quants.layout.repack`` gives (its numpy unpacking is
the reference the tests compare with), so a tile's products have the bits they had when the
whole matrix was repacked at load; the unpacking is paid once per weight row and tile, shared
by every token row of the call.
"""

from __future__ import annotations

import numba
import numpy as np

from ..quants.blocks import BLOCK_Q4_1, BLOCK_Q4_K, BLOCK_Q5_0, BLOCK_Q6_K, BLOCK_Q8_0
from ..quants.intdot_ir import Q41_BLOCK, Q41_QS, Q80_BLOCK, Q80_QS, QUINT_BLOCK, QUINT_QH, QUINT_QS
from ..quants.kblocks_ir import Q4K_BLOCK, Q4K_QS, Q4K_SCALES, Q6K_BLOCK, Q6K_D, Q6K_QH, Q6K_SCALES
from .kernels import half_value

GROUP = 32  # weights a block of the 32-weight formats, and a group of Q4_K
SUPER = 256  # weights a K-quant super-block
KINDS_WITH_MINS = (BLOCK_Q4_1, BLOCK_Q4_K)


@numba.njit(cache=True)
def has_mins(kind):
    """Whether blocks of ``kind`` carry a min per group (weight = code * scale + min)."""
    return kind == BLOCK_Q4_1 or kind == BLOCK_Q4_K


@numba.njit(cache=True)
def group_size(kind):
    """Weights a scale of ``kind`` covers (Q6_K: 16, the others 32)."""
    return 16 if kind == BLOCK_Q6_K else GROUP


@numba.njit(cache=True)
def _half(u, at):
    """The float32 value of the little-endian f16 at byte ``at`` (unsigned) of ``u``."""
    return half_value(np.uint16(np.uint16(u[at]) | (np.uint16(u[at + np.uint64(1)]) << np.uint16(8))))


# The loops below index with unsigned integers: a signed index gets numba's negative-index
# wraparound, which keeps LLVM from vectorizing (and views per block cost more than the copy).


@numba.njit(cache=True)
def _q8_0(q, u, at, n_blocks, codes, scales):
    for b in range(n_blocks):
        p, w = np.uint64(at + b * Q80_BLOCK), np.uint64(b * GROUP)
        scales[b] = _half(u, p)
        for j in range(GROUP):
            codes[w + np.uint64(j)] = q[p + np.uint64(Q80_QS + j)]


@numba.njit(cache=True)
def _q5_0(u, at, n_blocks, codes, scales):
    for b in range(n_blocks):
        p, w = np.uint64(at + b * QUINT_BLOCK), np.uint64(b * GROUP)
        scales[b] = _half(u, p)
        qh = np.uint32(0)
        for i in range(4):
            qh |= np.uint32(u[p + np.uint64(QUINT_QH + i)]) << np.uint32(8 * i)
        for j in range(16):
            byte = np.int32(u[p + np.uint64(QUINT_QS + j)])
            fifth = np.int32((qh >> np.uint32(j)) & np.uint32(1)) << 4
            codes[w + np.uint64(j)] = np.int8(((byte & 15) | fifth) - 16)
        for j in range(16):
            byte = np.int32(u[p + np.uint64(QUINT_QS + j)])
            fifth = np.int32((qh >> np.uint32(j + 16)) & np.uint32(1)) << 4
            codes[w + np.uint64(j + 16)] = np.int8(((byte >> 4) | fifth) - 16)


@numba.njit(cache=True)
def _q4_1(u, at, n_blocks, codes, scales, mins):
    for b in range(n_blocks):
        p, w = np.uint64(at + b * Q41_BLOCK), np.uint64(b * GROUP)
        scales[b] = _half(u, p)
        mins[b] = _half(u, p + np.uint64(2))
        for j in range(16):
            codes[w + np.uint64(j)] = np.int8(u[p + np.uint64(Q41_QS + j)] & 15)
        for j in range(16):
            codes[w + np.uint64(j + 16)] = np.int8(u[p + np.uint64(Q41_QS + j)] >> 4)


@numba.njit(cache=True)
def _q4_k(u, at, n_supers, codes, scales, mins):
    for b in range(n_supers):
        p, w, g0 = np.uint64(at + b * Q4K_BLOCK), np.uint64(b * SUPER), b * 8
        d, dmin = _half(u, p), _half(u, p + np.uint64(2))
        s = p + np.uint64(Q4K_SCALES)  # 12 bytes of 6-bit scales and mins
        for g in range(8):
            if g < 4:
                sc, m = u[s + np.uint64(g)] & 63, u[s + np.uint64(g + 4)] & 63
            else:
                sc = (u[s + np.uint64(g + 4)] & 15) | ((u[s + np.uint64(g - 4)] >> 6) << 4)
                m = (u[s + np.uint64(g + 4)] >> 4) | ((u[s + np.uint64(g)] >> 6) << 4)
            scales[g0 + g] = d * np.float32(sc)
            mins[g0 + g] = -(dmin * np.float32(m))
        qs = p + np.uint64(Q4K_QS)
        for c in range(4):  # 32 bytes a chunk: low nibbles are group 2c, high ones 2c + 1
            for j in range(32):
                codes[w + np.uint64(c * 64 + j)] = np.int8(u[qs + np.uint64(c * 32 + j)] & 15)
            for j in range(32):
                codes[w + np.uint64(c * 64 + 32 + j)] = np.int8(u[qs + np.uint64(c * 32 + j)] >> 4)


@numba.njit(cache=True)
def _q6_k(q, u, at, n_supers, codes, scales):
    for b in range(n_supers):
        p, g0 = np.uint64(at + b * Q6K_BLOCK), b * 16
        d = _half(u, p + np.uint64(Q6K_D))
        for g in range(16):
            scales[g0 + g] = d * np.float32(q[p + np.uint64(Q6K_SCALES + g)])  # (an int8 scale)
        for h in range(2):  # halves of 128: low nibbles from 64 ql bytes, top bits from 32 qh
            ql, qh = p + np.uint64(h * 64), p + np.uint64(Q6K_QH + h * 32)
            w = np.uint64(b * SUPER + h * 128)
            for quarter in range(4):  # 32 weights: nibble (quarter >> 1), crumb ``quarter``
                shift_low, shift_high = 4 * (quarter >> 1), 2 * quarter
                low_at = ql + np.uint64(32 * (quarter & 1))
                for j in range(32):
                    low = (np.int32(u[low_at + np.uint64(j)]) >> shift_low) & 15
                    high = (np.int32(u[qh + np.uint64(j)]) >> shift_high) & 3
                    codes[w + np.uint64(quarter * 32 + j)] = np.int8((low | (high << 4)) - 32)


@numba.njit(cache=True)
def unpack_rows(q, at, kind, cols, n_rows, codes, scales, mins):
    """Rows of blocks of ``kind`` from byte ``at`` of the arena ``q`` (int8) -> codes[: n_rows *
    cols] int8, scales[: n_rows * cols / group] float32 and, for kinds with mins, mins (as
    scales), row after row: the values ``quants.layout.repack`` gives for the same blocks."""
    u = q.view(np.uint8)
    weights = n_rows * cols
    if kind == BLOCK_Q8_0:
        _q8_0(q, u, at, weights // GROUP, codes, scales)
    elif kind == BLOCK_Q5_0:
        _q5_0(u, at, weights // GROUP, codes, scales)
    elif kind == BLOCK_Q4_1:
        _q4_1(u, at, weights // GROUP, codes, scales, mins)
    elif kind == BLOCK_Q4_K:
        _q4_k(u, at, weights // SUPER, codes, scales, mins)
    else:
        _q6_k(q, u, at, weights // SUPER, codes, scales)
