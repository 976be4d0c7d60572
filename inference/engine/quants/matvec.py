"""Matrix-vector product W @ x over a GroupLayout (the decode path: one token at a time).

One kernel call does the whole linear: it rounds x as ggml would for the weight's format
(quantize.py, a serial pass over one row), then takes the product and adds the bias.

Decoding reads every weight once per token, so the product is memory-bound: one long loop per
row that LLVM vectorizes (scale looked up as ``scales[r, j >> shift]``, the shift a compile-time
constant of each kernel variant). With mins, the offset term is factored out:
sum_j (q_j s + m) x_j = sum_j q_j s x_j + m * sum_j x_j per group, and the group sums of x are
shared by all rows (for Q8_1 they are its stored f16 block sums, as ggml uses them).
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from .layout import GroupLayout, dequantize_reference
from .quantize import ACT_NONE, round_row

NO_BIAS = np.zeros(0, np.float32)


@functools.cache
def matvec_kernel(group_shift: int, has_mins: bool, kind: int = ACT_NONE):
    """The fused round + matvec kernel for groups of ``1 << group_shift`` weights and activation
    rounding ``kind`` (numba caches each variant on disk)."""

    @numba.njit(parallel=True, fastmath=True, cache=True)
    def matvec(q, scales, mins, x, bias, out):
        rows, cols = q.shape
        n_groups = scales.shape[1]
        values = np.empty(cols, np.float32)  # (cols,) x as ggml rounds it
        group_sums = np.zeros(n_groups, np.float32)  # (n_groups,)
        round_row(kind, x, values, group_sums, 1 << group_shift, has_mins)
        for r in numba.prange(rows):
            acc = np.float32(0.0)
            for j in range(cols):
                acc += np.float32(q[r, j]) * scales[r, j >> group_shift] * values[j]
            if has_mins:
                for g in range(n_groups):
                    acc += mins[r, g] * group_sums[g]
            if bias.shape[0]:
                acc += bias[r]
            out[r] = acc

    return matvec


def matvec(
    layout: GroupLayout, x: np.ndarray, kind: int = ACT_NONE, bias: np.ndarray | None = None
) -> np.ndarray:
    """W @ round(x) (+ bias): x (cols,) float32 -> (rows,) float32."""
    rows, cols = layout.q.shape
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape != (cols,):
        raise ValueError(f"matvec expects x of shape ({cols},), got {x.shape}")
    out = np.empty(rows, np.float32)  # (rows,)
    bias = NO_BIAS if bias is None else bias
    matvec_kernel(layout.group_shift, layout.has_mins, kind)(*layout.kernel_arrays, x, bias, out)
    return out


def matvec_reference(layout: GroupLayout, x: np.ndarray) -> np.ndarray:
    """Plain numpy W @ x in float64 from the reference dequantization -> (rows,) float64."""
    return dequantize_reference(layout).astype(np.float64) @ np.asarray(x, np.float64)
