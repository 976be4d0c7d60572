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

from ..jit.intrinsics import load_word, store_word
from ..quants.blocks import BLOCK_Q4_1, BLOCK_Q4_K, BLOCK_Q5_0, BLOCK_Q6_K, BLOCK_Q8_0
from ..quants.codes import Q41_BLOCK, Q41_QS, Q80_BLOCK, Q80_QS, QUINT_BLOCK, QUINT_QH, QUINT_QS
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
def half_at(u, at):
    """The float32 value of the little-endian f16 at byte ``at`` of ``u``."""
    return half_value(np.uint16(np.uint16(u[at]) | (np.uint16(u[at + 1]) << np.uint16(8))))


# Eight codes a step, as uint64 words (load_word / store_word): numba's loops over bytes do
# not vectorize (the codes and the blocks are both byte arrays that might overlap), and
# bytes one at a time made prefill's unpacking a third of Qwen2.5's pp16.
LOW = np.uint64(0x0F0F0F0F0F0F0F0F)  # each byte's low nibble
ONES = np.uint64(0x0101010101010101)  # each byte's bit 0
CRUMB = np.uint64(0x0303030303030303)  # each byte's two low bits
# SPREAD[x]: bit i of the byte x as byte i's bit 0 (Q5_0's fifth bits, eight codes at once).
SPREAD = np.array([sum(((x >> i) & 1) << (8 * i) for i in range(8)) for x in range(256)], np.uint64)  # (256,)


@numba.njit(cache=True)
def _nibbles(q, qs, codes, w, n_bytes):
    """Bytes qs..qs+n_bytes (a multiple of 8): low nibbles to codes w.., high ones after."""
    for i in range(0, n_bytes, 8):
        word = load_word(q, qs + i)
        store_word(codes, w + i, word & LOW)
        store_word(codes, w + n_bytes + i, (word >> np.uint64(4)) & LOW)


@numba.njit(cache=True)
def _q8_0(q, u, at, n_blocks, codes, scales):
    for b in range(n_blocks):
        p, w = at + b * Q80_BLOCK, b * GROUP
        scales[b] = half_at(u, p)
        for i in range(0, GROUP, 8):
            store_word(codes, w + i, load_word(q, p + Q80_QS + i))


@numba.njit(cache=True)
def _q5_0(q, u, at, n_blocks, codes, scales):
    for b in range(n_blocks):
        p, w = at + b * QUINT_BLOCK, b * GROUP
        scales[b] = half_at(u, p)
        for i in range(0, 16, 8):
            word = load_word(q, p + QUINT_QS + i)
            for half in range(2):  # codes i.. from the low nibbles, codes 16 + i.. from the high
                fifth = SPREAD[u[p + QUINT_QH + 2 * half + i // 8]]  # (their fifth bits)
                low = (word >> np.uint64(4 * half)) & LOW
                # code - 16 as a byte: the nibble when the fifth bit is set, else nibble | 0xF0
                not_fifth = ~fifth & ONES
                store_word(codes, w + 16 * half + i, low | (not_fifth * np.uint64(0xF0)))


@numba.njit(cache=True)
def _q4_1(q, u, at, n_blocks, codes, scales, mins):
    for b in range(n_blocks):
        p = at + b * Q41_BLOCK
        scales[b] = half_at(u, p)
        mins[b] = half_at(u, p + 2)
        _nibbles(q, p + Q41_QS, codes, b * GROUP, 16)


@numba.njit(cache=True)
def _q4_k(q, u, at, n_supers, codes, scales, mins):
    for b in range(n_supers):
        p, g0 = at + b * Q4K_BLOCK, b * 8
        d, dmin = half_at(u, p), half_at(u, p + 2)
        s = p + Q4K_SCALES  # 12 bytes of 6-bit scales and mins
        for g in range(8):
            if g < 4:
                sc, m = u[s + g] & 63, u[s + g + 4] & 63
            else:
                sc = (u[s + g + 4] & 15) | ((u[s + g - 4] >> 6) << 4)
                m = (u[s + g + 4] >> 4) | ((u[s + g] >> 6) << 4)
            scales[g0 + g] = d * np.float32(sc)
            mins[g0 + g] = -(dmin * np.float32(m))
        for c in range(4):  # 32 bytes a chunk: low nibbles are group 2c, high ones 2c + 1
            _nibbles(q, p + Q4K_QS + 32 * c, codes, b * SUPER + 64 * c, 32)


@numba.njit(cache=True)
def _q6_k(q, u, at, n_supers, codes, scales):
    for b in range(n_supers):
        p, g0 = at + b * Q6K_BLOCK, b * 16
        d = half_at(u, p + Q6K_D)
        for g in range(16):
            scales[g0 + g] = d * np.float32(q[p + Q6K_SCALES + g])  # (an int8 scale)
        for h in range(2):  # halves of 128: low nibbles from 64 ql bytes, top bits from 32 qh
            for quarter in range(4):  # 32 codes: nibble (quarter >> 1) of ql, crumb ``quarter`` of qh
                ql = p + 64 * h + 32 * (quarter & 1)
                qh = p + Q6K_QH + 32 * h
                w = b * SUPER + 128 * h + 32 * quarter
                for i in range(0, 32, 8):
                    low = (load_word(q, ql + i) >> np.uint64(4 * (quarter >> 1))) & LOW
                    high = (load_word(q, qh + i) >> np.uint64(2 * quarter)) & CRUMB
                    # code - 32 as a byte: bit 5 of low | high << 4 set -> clear it, else | 0xE0
                    not_bit5 = (~high >> np.uint64(1)) & ONES
                    fourth = (high & ONES) << np.uint64(4)
                    store_word(codes, w + i, low | fourth | (not_bit5 * np.uint64(0xE0)))


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
        _q5_0(q, u, at, weights // GROUP, codes, scales)
    elif kind == BLOCK_Q4_1:
        _q4_1(q, u, at, weights // GROUP, codes, scales, mins)
    elif kind == BLOCK_Q4_K:
        _q4_k(q, u, at, weights // SUPER, codes, scales, mins)
    else:
        _q6_k(q, u, at, weights // SUPER, codes, scales)
