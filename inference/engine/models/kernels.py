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

from llvmlite import binding as llvm_binding

from ..intrinsics import bits_from_float, float_from_bits, half_bits_to_float

HOST_F16C = "+f16c" in llvm_binding.get_host_cpu_features().flatten()

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
    """Rotate one head vector x (head_dim,) by the angles cos, sin (n_rot/2,) like apply_rope."""
    half = cos.shape[0]
    for i in range(half):
        if neox:
            a, b = x[i], x[i + half]
            x[i] = a * cos[i] - b * sin[i]
            x[i + half] = a * sin[i] + b * cos[i]
        else:
            a, b = x[2 * i], x[2 * i + 1]
            x[2 * i] = a * cos[i] - b * sin[i]
            x[2 * i + 1] = a * sin[i] + b * cos[i]


@numba.njit(fastmath=True, cache=True)
def scores_into(q, keys, first, end, scale, out):
    """out[t - first] = scale * q . keys[t] for t in first..end; keys (ctx, hd) f16 bits."""
    for t in range(first, end):
        row = keys[t]
        acc = np.float32(0.0)
        for d in range(q.shape[0]):
            acc += q[d] * half_value(row[d])
        out[t - first] = acc * scale


@numba.njit(fastmath=True, cache=True)
def weighted_values(probs, values, first, out):
    """out = sum_t probs[t] * values[first + t]; values (ctx, hd) f16 bits."""
    out[:] = 0.0
    for t in range(probs.shape[0]):
        p, row = probs[t], values[first + t]
        for d in range(out.shape[0]):
            out[d] += p * half_value(row[d])


@numba.njit(cache=True)
def softmax_f16_inplace(scores):
    """Softmax in float32, summed in order; probabilities rounded to f16."""
    top = scores.max()
    total = np.float32(0.0)
    for t in range(scores.shape[0]):
        scores[t] = np.exp(scores[t] - top)
        total += scores[t]
    for t in range(scores.shape[0]):
        scores[t] /= total
    round_f16_inplace(scores)


@numba.njit(cache=True)
def attend_head(q, keys, values, pos, window, scale, scores, out):
    """One query head q (hd,), rotated and f16-rounded, at ``pos`` over cache rows up to
    ``pos`` (the last ``window`` only, if > 0); ``scores`` is scratch of at least pos+1."""
    first = max(0, pos + 1 - window) if window > 0 else 0
    probs = scores[: pos + 1 - first]
    scores_into(q, keys, first, pos + 1, scale, probs)
    softmax_f16_inplace(probs)
    weighted_values(probs, values, first, out)


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
