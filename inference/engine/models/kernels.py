"""The decode step's attention in one numba call: RoPE, the f16 cache write, attention.

For one new token this replaces a dozen numpy calls per layer (rope, cache write, the
score/softmax/value products), each costing more in call overhead than in arithmetic. It
rounds where ``layers.attention`` rounds (q, the cached k/v rows and the probabilities to f16,
as llama.cpp's f16 KV path does), so that plain numpy function stays its reference.
"""

from __future__ import annotations

import numba
import numpy as np

F16_MIN_NORMAL = np.float32(2.0**-14)
F16_SUBNORMAL_STEP = np.float32(2.0**-24)


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
    """out[t - first] = scale * q . keys[t] for t in first..end."""
    for t in range(first, end):
        acc = np.float32(0.0)
        for d in range(q.shape[0]):
            acc += q[d] * keys[t, d]
        out[t - first] = acc * scale


@numba.njit(fastmath=True, cache=True)
def weighted_values(probs, values, first, out):
    """out = sum_t probs[t] * values[first + t]."""
    out[:] = 0.0
    for t in range(probs.shape[0]):
        p = probs[t]
        for d in range(out.shape[0]):
            out[d] += p * values[first + t, d]


@numba.njit(cache=True)
def softmax_f16_inplace(scores):
    """Softmax in float32 as layers.attention computes it, probabilities rounded to f16."""
    top = scores.max()
    total = np.float32(0.0)
    for t in range(scores.shape[0]):
        scores[t] = np.exp(scores[t] - top)
        total += scores[t]
    for t in range(scores.shape[0]):
        scores[t] /= total
    round_f16_inplace(scores)


@numba.njit(parallel=True, cache=True)
def decode_attention(q, k_new, v_new, cos, sin, neox, cache_k, cache_v, pos, window, scale, out):
    """One token at ``pos``: rotate q (heads, hd) and k_new (kvh, hd), store k_new and v_new
    (kvh, hd_v) at row ``pos`` of this layer's cache (kvh, ctx, hd), attend over rows
    ``0..pos`` (the last ``window`` only, if > 0) and write out (heads, hd_v)."""
    n_heads, n_kv = q.shape[0], k_new.shape[0]
    group = n_heads // n_kv
    for h in range(n_kv):
        rope_inplace(k_new[h], cos, sin, neox)
        cache_k[h, pos] = k_new[h]
        cache_v[h, pos] = v_new[h]
        round_f16_inplace(cache_k[h, pos])
        round_f16_inplace(cache_v[h, pos])
    first = max(0, pos + 1 - window) if window > 0 else 0
    for h in numba.prange(n_heads):
        kv = h // group
        qh = q[h].copy()  # (hd,)
        rope_inplace(qh, cos, sin, neox)
        round_f16_inplace(qh)
        scores = np.empty(pos + 1 - first, np.float32)  # (n_keys,)
        scores_into(qh, cache_k[kv], first, pos + 1, scale, scores)
        softmax_f16_inplace(scores)
        weighted_values(scores, cache_v[kv], first, out[h])


@numba.njit(parallel=True, cache=True)
def prefill_attention(q, cache_k, cache_v, start, window, scale, out):
    """Causal attention of q (n, heads, hd), already rotated, at positions ``start..start+n``
    over this layer's cache rows (kvh, ctx, hd), which already hold the new rows; writes
    out (n, heads, hd_v). Equal to ``layers.attention`` up to float32 summation order."""
    n, n_heads = q.shape[0], q.shape[1]
    group = n_heads // cache_k.shape[0]
    for item in numba.prange(n * n_heads):
        # Pair early and late queries in neighbouring items: each thread's static share of the
        # range then holds as many keys as the other's, though later queries see more keys.
        k, h = item // n_heads, item % n_heads
        i = k // 2 if k % 2 == 0 else n - 1 - k // 2
        pos = start + i
        first = max(0, pos + 1 - window) if window > 0 else 0
        qh = q[i, h].copy()  # (hd,)
        round_f16_inplace(qh)
        scores = np.empty(pos + 1 - first, np.float32)  # (n_keys,)
        scores_into(qh, cache_k[h // group], first, pos + 1, scale, scores)
        softmax_f16_inplace(scores)
        weighted_values(scores, cache_v[h // group], first, out[i, h])
