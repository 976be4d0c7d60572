"""Attention on one row, in numba, over an f16 KV cache: RoPE, the f16 cache write, scores,
softmax and the weighted values.

The cache holds float16 bit patterns (uint16: numba has no float16 arithmetic); a row is
converted to float32 as it is read. q, the cached rows and the probabilities are rounded to
f16 as llama.cpp's f16 KV path does. Every reduction here runs over one query row in one fixed
order, so a row's result does not depend on how many rows are computed with it: the fused
forward (step_kernels.py) and the per-layer numpy path (``attend_rows``) share these.
"""

from __future__ import annotations

import numba
import numpy as np

from ..jit.intrinsics import bits_from_float, float_from_bits, fma32, half_bits_to_float
from ..jit.simd import target_features
from .attention_ir import score_f16c, score_generic
from .ggml_math import expf_ggml, hsum8

HOST_F16C = "f16c" in target_features()

F16_MIN_NORMAL = np.float32(2.0**-14)
F16_SUBNORMAL_STEP = np.float32(2.0**-24)
HALF_TO_FLOAT_SCALE = np.float32(2.0**112)  # rebias a float16 exponent (15) to float32's (127)


@numba.njit(cache=True)
def round_f16_inplace(a):
    """Round a contiguous float32 vector to nearest-even float16 values, in place.

    Normal range: drop 13 mantissa bits with round-half-even on the bit pattern. Below
    2**-14 float16 is subnormal with a fixed step of 2**-24. (Overflow past 65504 is not
    turned into inf: attention operands never get there.)"""
    bits = a.view(np.uint32)
    for i in range(a.shape[0]):
        if abs(a[i]) < F16_MIN_NORMAL:
            a[i] = np.rint(a[i] / F16_SUBNORMAL_STEP) * F16_SUBNORMAL_STEP
        else:
            b = bits[i]
            bits[i] = (b + 0xFFF + ((b >> 13) & 1)) & 0xFFFFE000


@numba.njit(cache=True)
def f16_bits(v, b):
    """The float16 bit pattern nearest (ties to even) to a float32 ``v`` with |v| < 65504,
    given ``b``, the bits of v."""
    sign = (b >> np.uint32(16)) & np.uint32(0x8000)
    magnitude = abs(v)
    if magnitude < F16_MIN_NORMAL:  # subnormal: a multiple of 2**-24, 1024 = the first normal
        return np.uint16(sign | np.uint32(np.rint(magnitude / F16_SUBNORMAL_STEP)))
    b = (b & np.uint32(0x7FFFFFFF)) + np.uint32(0xFFF) + ((b >> np.uint32(13)) & np.uint32(1))
    exponent = (b >> np.uint32(23)) - np.uint32(112)  # rebias 127 -> 15
    return np.uint16(sign | (exponent << np.uint32(10)) | ((b >> np.uint32(13)) & np.uint32(0x3FF)))


@numba.njit(cache=True)
def half_value_generic(h):
    """The float32 value of float16 bits ``h`` (finite) in integer and float32 operations: the
    magnitude bits moved into float32 position and rebiased by an exact power-of-two multiply,
    which covers subnormals too. For CPUs without F16C."""
    magnitude = float_from_bits(np.uint32(h & 0x7FFF) << np.uint32(13)) * HALF_TO_FLOAT_SCALE
    return -magnitude if h & 0x8000 else magnitude


@numba.njit(cache=True)
def half_value_f16c(h):
    """The float32 value of float16 bits ``h`` through the F16C conversion."""
    return half_bits_to_float(np.uint16(h))


# Both are exact conversions (the same values); the host's is used.
half_value = half_value_f16c if HOST_F16C else half_value_generic


@numba.njit(cache=True)
def store_half(src, dst):
    """dst (n,) uint16 = float16 bits of src (n,) float32, rounded to nearest even."""
    for i in range(src.shape[0]):
        dst[i] = f16_bits(src[i], bits_from_float(src[i]))


@numba.njit(cache=True)
def rope_inplace(x, cos, sin, neox):
    """Rotate one head vector x (head_dim,) by the angles cos, sin (n_rot/2,) as ggml's compiled
    rotate_pairs does: x0' = fma(x0, cos, -(x1 * sin)), x1' = fma(x0, sin, x1 * cos) (C's
    contraction of the first product; matches llama.cpp's tensors bit for bit)."""
    half = cos.shape[0]
    for i in range(half):
        i0, i1 = (i, i + half) if neox else (2 * i, 2 * i + 1)
        a, b = x[i0], x[i1]
        x[i0] = fma32(a, cos[i], -(b * sin[i]))
        x[i1] = fma32(a, sin[i], b * cos[i])


@numba.njit(cache=True)
def rope_rows(x, cos, sin, neox):
    """rope_inplace over x (n, heads, head_dim), row i by cos[i], sin[i]."""
    for i in range(x.shape[0]):
        for h in range(x.shape[1]):
            rope_inplace(x[i, h], cos[i], sin[i], neox)


@numba.njit(cache=True)
def scores_into_f16c(q, keys, first, end, scale, out):
    for t in range(first, end):
        out[t - first] = score_f16c(q, keys, t) * scale


@numba.njit(cache=True)
def scores_into_generic(q, keys, first, end, scale, out):
    for t in range(first, end):
        out[t - first] = score_generic(q, keys, t) * scale


# scores_into(q, keys, first, end, scale, out): out[t - first] = scale * q . keys[t] for t in
# first..end, keys (ctx, hd) f16 bits, each dot summed as tinyBLAS sums it (attention_ir.py).
# Both selections give the same bits; the host's is used.
scores_into = scores_into_f16c if HOST_F16C else scores_into_generic


@numba.njit(cache=True)
def weighted_values(probs, values, first, out, lanes):
    """out = sum_t probs[t] * values[first + t]; values (ctx, hd) f16 bits. As tinyBLAS sums
    it: key t goes to lane (first + t) mod 8 (lanes count from cache row 0), FMA per lane,
    lanes summed by hsum8. ``lanes`` is scratch (8, hd)."""
    lanes[:] = 0.0
    for t in range(probs.shape[0]):
        p, row, lane = probs[t], values[first + t], lanes[(first + t) % 8]
        for d in range(out.shape[0]):
            lane[d] = fma32(half_value(row[d]), p, lane[d])
    for d in range(out.shape[0]):
        out[d] = hsum8(
            lanes[0, d],
            lanes[1, d],
            lanes[2, d],
            lanes[3, d],
            lanes[4, d],
            lanes[5, d],
            lanes[6, d],
            lanes[7, d],
        )


@numba.njit(cache=True)
def softmax_f16_inplace(scores, first):
    """llama.cpp's softmax of scores for cache rows first.. (masked rows before them count as
    zeros): ggml_v_expf per value, float sums of 8-row blocks aligned to cache row 0 added in
    float64, probabilities times float32(1 / sum), then rounded to f16."""
    top = scores.max()
    n = scores.shape[0]
    for t in range(n):
        scores[t] = expf_ggml(scores[t] - top)
    total = 0.0
    lane = np.zeros(8, np.float32)  # (8,) one block, zeros for rows outside first..
    for start in range(first - first % 8, first + n, 8):
        for i in range(8):
            t = start + i - first
            lane[i] = scores[t] if 0 <= t < n else np.float32(0.0)
        total += np.float64(hsum8(lane[0], lane[1], lane[2], lane[3], lane[4], lane[5], lane[6], lane[7]))
    inverse = np.float32(1.0 / total)
    for t in range(n):
        scores[t] *= inverse
    round_f16_inplace(scores)


@numba.njit(cache=True)
def attend_head(q, keys, values, pos, window, scale, scores, out):
    """One query head q (hd,), rotated and f16-rounded, at ``pos`` over cache rows up to
    ``pos`` (the last ``window`` only, if > 0); ``scores`` is scratch of at least pos+1."""
    first = max(0, pos + 1 - window) if window > 0 else 0
    probs = scores[: pos + 1 - first]
    lanes = np.empty((8, out.shape[0]), np.float32)  # (8, hd_v)
    scores_into(q, keys, first, pos + 1, scale, probs)
    softmax_f16_inplace(probs, first)
    weighted_values(probs, values, first, out, lanes)


@numba.njit(parallel=True, cache=True)
def attend_rows(q, cache_k, cache_v, start, window, scale, out):
    """Causal attention of q (n, heads, hd), already rotated, at positions ``start..start+n``
    over this layer's cache rows (kvh, ctx, hd) of f16 bits, which already hold the new rows;
    writes out (n, heads, hd_v)."""
    n, n_heads = q.shape[0], q.shape[1]
    group = n_heads // cache_k.shape[0]
    for item in numba.prange(n * n_heads):
        i, h = item // n_heads, item % n_heads
        qh = q[i, h].copy()  # (hd,)
        round_f16_inplace(qh)
        scores = np.empty(start + i + 1, np.float32)  # (keys,)
        attend_head(qh, cache_k[h // group], cache_v[h // group], start + i, window, scale, scores, out[i, h])
