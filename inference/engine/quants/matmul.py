"""Matrix product x @ W.T over a GroupLayout (the prefill path: many tokens at once).

One kernel call does the whole linear: the token rows are rounded as ggml would for the
weight's format (in parallel over tokens), then blocks of 4 weight rows are dequantized once
into a small float32 scratch and every token is multiplied against all 4 rows in one pass over
the columns, two tokens at a time: 8 running sums per pass, each weight and input load reused
2-4 times. Mins are factored out as in matvec.py. This stays inside numba on purpose: on 2 cores
OpenBLAS and numba threads spin against each other when their calls alternate.
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from .layout import GroupLayout, dequantize_reference
from .matvec import NO_BIAS
from .quantize import ACT_NONE, round_row

ROW_BLOCK = 4  # rows dequantized together; _dot_4x2 is written out for 4


@numba.njit(fastmath=True, cache=True)
def _dot_4x2(w, x, t, u, cols):
    """The 8 dot products of 4 scratch rows with tokens t and u."""
    t0 = t1 = t2 = t3 = u0 = u1 = u2 = u3 = np.float32(0.0)
    for j in range(cols):
        xt, xu = x[t, j], x[u, j]
        w0, w1, w2, w3 = w[0, j], w[1, j], w[2, j], w[3, j]
        t0 += w0 * xt
        t1 += w1 * xt
        t2 += w2 * xt
        t3 += w3 * xt
        u0 += w0 * xu
        u1 += w1 * xu
        u2 += w2 * xu
        u3 += w3 * xu
    return (t0, t1, t2, t3), (u0, u1, u2, u3)


@functools.cache
def matmul_kernel(group_shift: int, has_mins: bool, kind: int = ACT_NONE):
    """The fused round + matmul kernel for groups of ``1 << group_shift`` weights and activation
    rounding ``kind`` (numba caches each variant on disk)."""

    @numba.njit(parallel=True, fastmath=True, cache=True)
    def matmul(q, scales, mins, x, bias, out):
        rows, cols = q.shape
        n_tokens, n_groups = x.shape[0], scales.shape[1]
        values = np.empty((n_tokens, cols), np.float32)  # (n, cols) x as ggml rounds it
        group_sums = np.zeros((n_tokens, n_groups), np.float32)  # (n, n_groups)
        for t in numba.prange(n_tokens):
            round_row(kind, x[t], values[t], group_sums[t], 1 << group_shift, has_mins)
        for block in numba.prange((rows + ROW_BLOCK - 1) // ROW_BLOCK):
            first = block * ROW_BLOCK
            live = min(ROW_BLOCK, rows - first)
            w = np.zeros((ROW_BLOCK, cols), np.float32)  # (4, cols) this block's rows, dequantized
            for i in range(live):
                for j in range(cols):
                    w[i, j] = np.float32(q[first + i, j]) * scales[first + i, j >> group_shift]
            for t in range(0, n_tokens, 2):
                u = min(t + 1, n_tokens - 1)  # an odd last token is simply computed twice
                sums_t, sums_u = _dot_4x2(w, values, t, u, cols)
                for i in range(live):
                    out[t, first + i] = sums_t[i]
                    out[u, first + i] = sums_u[i]
            for i in range(live):
                r = first + i
                extra = bias[r] if bias.shape[0] else np.float32(0.0)
                for t in range(n_tokens):
                    acc = extra
                    if has_mins:
                        for g in range(n_groups):
                            acc += mins[r, g] * group_sums[t, g]
                    out[t, r] += acc

    return matmul


def matmul(
    layout: GroupLayout, x: np.ndarray, kind: int = ACT_NONE, bias: np.ndarray | None = None
) -> np.ndarray:
    """round(x) @ W.T (+ bias): x (n, cols) float32 -> (n, rows) float32."""
    rows, cols = layout.q.shape
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != cols:
        raise ValueError(f"matmul expects x of shape (n, {cols}), got {x.shape}")
    out = np.empty((x.shape[0], rows), np.float32)  # (n, rows)
    bias = NO_BIAS if bias is None else bias
    if x.shape[0]:
        matmul_kernel(layout.group_shift, layout.has_mins, kind)(*layout.kernel_arrays, x, bias, out)
    return out


def matmul_reference(layout: GroupLayout, x: np.ndarray) -> np.ndarray:
    """Plain numpy x @ W.T in float64 from the reference dequantization -> (n, rows) float64."""
    return np.asarray(x, np.float64) @ dequantize_reference(layout).astype(np.float64).T
