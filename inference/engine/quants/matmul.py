"""Products of a weight matrix with N activation rows, each row's result independent of N.

Every output element is the integer group dot product of matvec.py (exact int32 sums of int8
weight codes times the row's int8 codes, scaled per group and accumulated in one fixed order,
intdot.py), whether one row or a thousand are multiplied: a token's logits must not depend on
how many tokens were computed with it. This is the product of the per-layer numpy path (the
fused forward, fused/step_kernels.py, calls the same dot product itself).
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from .intdot import dot_row_int, min_sum
from .layout import GroupLayout
from .quantize import ACT_Q8_0, round_row_int

NO_BIAS = np.zeros(0, np.float32)


@functools.cache
def matrows_kernel(group_shift: int, has_mins: bool, kind: int = ACT_Q8_0):
    """The round + product kernel for groups of ``1 << group_shift`` weights and activation
    rounding ``kind`` (an integer kind: every block format's; numba caches each variant)."""

    @numba.njit(parallel=True, cache=True)
    def matrows(q, scales, mins, x, bias, out):
        n, cols = x.shape
        n_groups = scales.shape[1]
        values = np.empty((n, cols), np.float32)  # (n, cols) x as ggml rounds it
        codes = np.empty((n, cols), np.int8)  # (n, cols) the same as integer codes
        code_scales = np.empty((n, n_groups), np.float32)  # (n, n_groups) their scale per group
        group_sums = np.zeros((n, n_groups), np.float32)  # (n, n_groups)
        for t in numba.prange(n):
            round_row_int(
                kind, x[t], values[t], codes[t], code_scales[t], group_sums[t], 1 << group_shift, has_mins
            )
        q_flat, scales_flat, mins_flat = q.reshape(-1), scales.reshape(-1), mins.reshape(-1)
        for r in numba.prange(q.shape[0]):
            for t in range(n):
                acc = dot_row_int(
                    q_flat,
                    r * cols,
                    codes[t],
                    scales_flat,
                    r * n_groups,
                    code_scales[t],
                    n_groups,
                    group_shift,
                )
                if has_mins:
                    acc += min_sum(mins_flat, r * n_groups, group_sums[t], n_groups)
                if bias.shape[0]:
                    acc += bias[r]
                out[t, r] = acc

    return matrows


def matmul(
    layout: GroupLayout, x: np.ndarray, kind: int = ACT_Q8_0, bias: np.ndarray | None = None
) -> np.ndarray:
    """round(x) @ W.T (+ bias): x (n, cols) float32 -> (n, rows) float32, x rounded as ``kind``."""
    rows, cols = layout.shape
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != cols:
        raise ValueError(f"matmul expects x of shape (n, {cols}), got {x.shape}")
    out = np.empty((x.shape[0], rows), np.float32)  # (n, rows)
    if x.shape[0]:
        bias = NO_BIAS if bias is None else np.asarray(bias, np.float32)
        matrows_kernel(layout.group_shift, layout.has_mins, kind)(*layout.kernel_arrays, x, bias, out)
    return out


@numba.njit(parallel=True, fastmath=True, cache=True)
def _float_rows(weights, values, out):
    for r in numba.prange(weights.shape[0]):
        w_row = weights[r]
        for t in range(values.shape[0]):
            acc = np.float32(0.0)
            for j in range(w_row.shape[0]):
                acc += w_row[j] * values[t, j]
            out[t, r] = acc


def float_matmul(weights: np.ndarray, values: np.ndarray) -> np.ndarray:
    """values (n, cols) @ weights.T for float32 weights (rows, cols), each row summed in one
    fixed order (BLAS would change its order with n)."""
    out = np.empty((values.shape[0], weights.shape[0]), np.float32)  # (n, rows)
    _float_rows(weights, np.ascontiguousarray(values, np.float32), out)
    return out
