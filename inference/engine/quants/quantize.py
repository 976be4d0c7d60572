"""Activation rounding in numba, equal value for value to the numpy reference in activations.py.

Every product first rounds its input row the way ggml quantizes it for the weight's format.
Doing that in numpy costs a dozen array passes and Python calls per linear; here it is one
serial pass per row inside the product kernel. The kernels take the rounded values (q * d) and,
for weights with mins, the per-group sums the min term multiplies (Q8_1's f16 block sums, or
d * sum(q) per group for Q8_K), so no float detail of ggml's integer arithmetic is lost.

These functions are compiled without fastmath: rint, the float32 divisions and the f16
rounding must happen exactly as written.
"""

from __future__ import annotations

import math

import gguf
import numba
import numpy as np

T = gguf.GGMLQuantizationType

# Which rounding a product applies to its input (compile-time constants of the kernels).
ACT_NONE, ACT_Q8_0, ACT_Q8_1, ACT_Q8_K, ACT_F16, ACT_BF16 = 0, 1, 2, 3, 4, 5

ACTIVATION_KIND = {
    T.F32: ACT_NONE,
    T.F16: ACT_F16,
    T.BF16: ACT_BF16,
    T.Q4_0: ACT_Q8_0,
    T.Q5_0: ACT_Q8_0,
    T.Q8_0: ACT_Q8_0,
    T.Q4_1: ACT_Q8_1,
    T.Q5_1: ACT_Q8_1,
    T.Q2_K: ACT_Q8_K,
    T.Q3_K: ACT_Q8_K,
    T.Q4_K: ACT_Q8_K,
    T.Q5_K: ACT_Q8_K,
    T.Q6_K: ACT_Q8_K,
    T.TQ1_0: ACT_Q8_K,  # ggml's vec_dot_type for both ternary formats
    T.TQ2_0: ACT_Q8_K,
}

F16_MAX = 65504.0


@numba.njit(cache=True)
def round_f16(value):
    """float32 -> nearest-even float16 -> float32, without numba's missing float16 type."""
    v = np.float64(value)
    if v == 0.0 or not math.isfinite(v):
        return np.float32(value)
    exponent = math.frexp(v)[1]  # v = m * 2**exponent, 0.5 <= |m| < 1
    quantum = math.ldexp(1.0, max(exponent - 11, -24))  # 11 significant bits; subnormals below 2**-14
    rounded = np.rint(v / quantum) * quantum
    if abs(rounded) > F16_MAX:
        return np.float32(math.copysign(math.inf, v))
    return np.float32(rounded)


@numba.njit(cache=True)
def _round_q8_32(x, values, group_sums, group_size, with_sums_f16, ints, int_scales):
    """Q8_0 (and Q8_1 when ``with_sums_f16``) over 32-wide blocks of one row. With non-empty
    ``ints`` also the integer codes and, per weight group, the block's d (see round_row_int)."""
    zero, q_max = np.float32(0.0), np.float32(127.0)
    for b in range(x.shape[0] // 32):
        amax = zero
        for j in range(b * 32, b * 32 + 32):
            amax = max(amax, abs(x[j]))
        d = amax / q_max
        inv = q_max / amax if amax != zero else zero
        d16 = round_f16(d)
        q_sum = zero
        for j in range(b * 32, b * 32 + 32):
            q = np.rint(x[j] * inv)
            q_sum += q
            values[j] = q * d16
            if ints.shape[0]:
                ints[j] = np.int8(q)
        if ints.shape[0]:
            for g in range(b * 32 // group_size, (b + 1) * 32 // group_size):
                int_scales[g] = d16
        if with_sums_f16:
            group_sums[b] = round_f16(d * q_sum)  # Q8_1 groups are its 32-wide blocks


@numba.njit(cache=True)
def _round_q8_k(x, values, group_sums, group_size, with_sums, ints, int_scales):
    """Q8_K over 256-wide blocks: scaled by the signed extreme, d kept in float32."""
    zero = np.float32(0.0)
    for b in range(x.shape[0] // 256):
        first = b * 256
        extreme, amax = zero, zero
        for j in range(first, first + 256):
            if abs(x[j]) > amax:  # the first of equal magnitudes, like argmax
                amax, extreme = abs(x[j]), x[j]
        iscale = np.float32(-127.0) / extreme if extreme != zero else zero
        d = np.float32(1.0) / iscale if iscale != zero else zero
        for g in range(first // group_size, (first + 256) // group_size):
            q_sum = zero
            for j in range(g * group_size, (g + 1) * group_size):
                q = min(np.rint(x[j] * iscale), np.float32(127.0))
                q_sum += q
                values[j] = q * d
                if ints.shape[0]:
                    ints[j] = np.int8(q)
            if ints.shape[0]:
                int_scales[g] = d
            if with_sums:
                group_sums[g] = d * q_sum


@numba.njit(cache=True)
def round_row(kind, x, values, group_sums, group_size, with_sums):
    """Round one row ``x`` (cols,) into ``values`` (cols,); with ``with_sums`` also fill
    ``group_sums`` (cols // group_size,), what a weight's per-group min multiplies."""
    # Empty views (no allocation): the integer codes are not wanted here.
    no_ints, no_scales = values[:0].view(np.int8), values[:0]
    if kind == ACT_Q8_0 or kind == ACT_Q8_1:
        _round_q8_32(x, values, group_sums, group_size, with_sums and kind == ACT_Q8_1, no_ints, no_scales)
    elif kind == ACT_Q8_K:
        _round_q8_k(x, values, group_sums, group_size, with_sums, no_ints, no_scales)
    elif kind == ACT_F16:
        for j in range(x.shape[0]):
            values[j] = round_f16(x[j])
    elif kind == ACT_BF16:
        _round_bf16(x, values)
    else:
        for j in range(x.shape[0]):
            values[j] = x[j]
        if with_sums:
            for g in range(x.shape[0] // group_size):
                s = np.float32(0.0)
                for j in range(g * group_size, (g + 1) * group_size):
                    s += x[j]
                group_sums[g] = s


@numba.njit(cache=True)
def round_row_int(kind, x, values, ints, int_scales, group_sums, group_size, with_sums):
    """round_row for the integer kinds (Q8_0, Q8_1, Q8_K), also giving the integer codes
    ``ints`` (cols,) int8 and, per weight group of ``group_size``, the activation block's
    scale ``int_scales`` (cols // group_size,): values[j] == ints[j] * int_scales[j // G]."""
    if kind == ACT_Q8_K:
        _round_q8_k(x, values, group_sums, group_size, with_sums, ints, int_scales)
    else:
        _round_q8_32(x, values, group_sums, group_size, with_sums and kind == ACT_Q8_1, ints, int_scales)


@numba.njit(cache=True)
def _round_bf16(x, values):
    """Nearest-even bfloat16, as ggml's FP32_TO_BF16 (activations.round_bf16)."""
    bits, out = x.view(np.uint32), values.view(np.uint32)
    for j in range(x.shape[0]):
        b = bits[j]
        out[j] = (b + (np.uint32(0x7FFF) + ((b >> 16) & np.uint32(1)))) & np.uint32(0xFFFF0000)


@numba.njit(parallel=True, cache=True)
def _round_rows(kind, x, values, group_sums, group_size, with_sums):
    for t in numba.prange(x.shape[0]):
        round_row(kind, x[t], values[t], group_sums[t], group_size, with_sums)


def round_activations(x: np.ndarray, kind: int, group_size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """x (n, cols) -> rounded values (n, cols) and per-group min multipliers (n, cols // group_size).

    The plain entry point to the row kernels, for tests and callers outside a product kernel."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    values = np.empty_like(x)  # (n, cols)
    group_sums = np.zeros((x.shape[0], x.shape[1] // group_size), np.float32)  # (n, groups)
    _round_rows(kind, x, values, group_sums, group_size, True)
    return values, group_sums
