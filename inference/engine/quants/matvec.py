"""Matrix-vector product W @ x over a GroupLayout (the decode path: one token at a time).

One kernel call does the whole linear: it rounds x as ggml would for the weight's format
(quantize.py, a serial pass over one row), then takes the product and adds the bias.

Decoding reads every weight once per token, so the product is memory-bound; each row is one
integer group dot product (intdot.py: exact int8 x int8 sums per group, scaled in float, as
ggml computes them). With mins, the offset term is factored out:
sum_j (q_j s + m) x_j = sum_j q_j s x_j + m * sum_j x_j per group, and the group sums of x are
shared by all rows (for Q8_1 they are its stored f16 block sums, as ggml uses them).
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from .intdot import add_min_terms, dot_row_int
from .layout import GroupLayout, dequantize_reference
from .quantize import ACT_Q8_0, round_activations, round_row_int

NO_BIAS = np.zeros(0, np.float32)


@functools.cache
def matvec_kernel(group_shift: int, has_mins: bool, kind: int = ACT_Q8_0):
    """The fused round + matvec kernel for groups of ``1 << group_shift`` weights and activation
    rounding ``kind`` (an integer kind: every block format's; numba caches each variant)."""

    @numba.njit(parallel=True, fastmath=True, cache=True)
    def matvec(q, scales, mins, x, bias, out):
        rows, cols = q.shape
        n_groups = scales.shape[1]
        values = np.empty(cols, np.float32)  # (cols,) x as ggml rounds it
        codes = np.empty(cols, np.int16)  # (cols,) the same as integer codes
        code_scales = np.empty(n_groups, np.float32)  # (n_groups,) their scale per weight group
        group_sums = np.zeros(n_groups, np.float32)  # (n_groups,)
        round_row_int(kind, x, values, codes, code_scales, group_sums, 1 << group_shift, has_mins)
        q_flat, scales_flat, mins_flat = q.reshape(-1), scales.reshape(-1), mins.reshape(-1)
        for r in numba.prange(rows):
            acc = dot_row_int(
                q_flat, r * cols, codes, scales_flat, r * n_groups, code_scales, n_groups, group_shift
            )
            if has_mins:
                acc = add_min_terms(acc, mins_flat, r * n_groups, group_sums, n_groups)
            if bias.shape[0]:
                acc += bias[r]
            out[r] = acc

    return matvec


def matvec(
    layout: GroupLayout, x: np.ndarray, kind: int = ACT_Q8_0, bias: np.ndarray | None = None
) -> np.ndarray:
    """W @ round(x) (+ bias): x (cols,) float32 -> (rows,) float32, x rounded as ``kind``."""
    rows, cols = layout.q.shape
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape != (cols,):
        raise ValueError(f"matvec expects x of shape ({cols},), got {x.shape}")
    out = np.empty(rows, np.float32)  # (rows,)
    bias = NO_BIAS if bias is None else bias
    matvec_kernel(layout.group_shift, layout.has_mins, kind)(*layout.kernel_arrays, x, bias, out)
    return out


def matvec_reference(layout: GroupLayout, x: np.ndarray, kind: int = ACT_Q8_0) -> np.ndarray:
    """Plain numpy in float64: the scaled weights times x rounded as ``kind``, plus the mins
    times the rounded groups' sums (what the kernel multiplies them with) -> (rows,) float64."""
    values, group_sums = round_activations(np.asarray(x, np.float32)[None], kind, layout.group_size)
    scaled = GroupLayout(layout.q, layout.scales, None, layout.group_size)
    out = dequantize_reference(scaled).astype(np.float64) @ values[0].astype(np.float64)
    if layout.mins is not None:
        out += layout.mins.astype(np.float64) @ group_sums[0].astype(np.float64)
    return out
