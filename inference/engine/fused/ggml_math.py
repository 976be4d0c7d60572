"""Scalar float32 functions that llama.cpp's CPU backend computes its own way, reproduced to
the last bit so our activations and attention match its tensors (docs/FIDELITY.md)."""

from __future__ import annotations

import numba
import numpy as np

from ..jit.intrinsics import bits_from_float, float_from_bits, fma32

# expf_ggml's constants (the ARM optimized-routines expf that ggml adapted), exact in float32.
EXP_SHIFT = np.float32(float.fromhex("0x1.8p23"))  # adding it rounds to an integer in the low bits
EXP_LOG2E = np.float32(float.fromhex("0x1.715476p+0"))
EXP_LN2_HI, EXP_LN2_LO = np.float32(float.fromhex("0x1.62e4p-1")), np.float32(float.fromhex("0x1.7f7d1cp-20"))
EXP_POLY = tuple(
    np.float32(float.fromhex(h))
    for h in ("0x1.0e4020p-7", "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2", "0x1.ffffecp-1")
)


@numba.njit(cache=True)
def hsum8(a0, a1, a2, a3, a4, a5, a6, a7):
    """Eight lanes summed in ggml's order (hsum_float_8, tinyBLAS's hsum)."""
    return ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3))


@numba.njit(cache=True)
def expf_ggml(x):
    """ggml's AVX2 ``ggml_v_expf`` for one float32 (a polynomial after a split into 2**n and a
    remainder, FMA throughout): the exp its softmax and SiLU use, to the last bit."""
    shift = EXP_SHIFT
    z = fma32(x, EXP_LOG2E, shift)
    n = z - shift
    b = fma32(-n, EXP_LN2_LO, fma32(-n, EXP_LN2_HI, x))
    e = bits_from_float(z) << np.uint32(23)
    k = float_from_bits(e + np.uint32(0x3F800000))
    u = b * b
    c0, c1, c2, c3, c4 = EXP_POLY
    j = fma32(fma32(fma32(c0, b, c1), u, fma32(c2, b, c3)), u, c4 * b)
    # Both of ggml's paths are computed and one selected (no branch: loops over it vectorize).
    g = np.uint32(0x82000000) if n <= np.float32(0.0) else np.uint32(0)
    s1, s2 = float_from_bits(g + np.uint32(0x7F000000)), float_from_bits(e - g)
    scaled = fma32(s2, j, s2) * s1 if abs(n) <= np.float32(192.0) else s1 * s1
    return fma32(j, k, k) if abs(n) <= np.float32(126.0) else scaled
