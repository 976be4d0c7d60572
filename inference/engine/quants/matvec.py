"""Matrix-vector product W @ x over a GroupLayout (the decode path: one token at a time).

One kernel call does the whole linear (matmul.py's, with one row): it rounds x as ggml would
for the weight's format (quantize.py, a serial pass over one row), then takes the product and
adds the bias.

Decoding reads every weight once per token, so the product is memory-bound; each row is one
integer group dot product (intdot.py: exact int8 x int8 sums per group, scaled in float, as
ggml computes them). With mins, the offset term is factored out:
sum_j (q_j s + m) x_j = sum_j q_j s x_j + m * sum_j x_j per group, and the group sums of x are
shared by all rows (for Q8_1 they are its stored f16 block sums, as ggml uses them).
"""

from __future__ import annotations

import numpy as np

from .layout import GroupLayout, dequantize_reference
from .matmul import matmul
from .quantize import ACT_Q8_0, round_activations


def matvec(
    layout: GroupLayout, x: np.ndarray, kind: int = ACT_Q8_0, bias: np.ndarray | None = None
) -> np.ndarray:
    """W @ round(x) (+ bias): x (cols,) float32 -> (rows,) float32, x rounded as ``kind``."""
    cols = layout.shape[1]
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape != (cols,):
        raise ValueError(f"matvec expects x of shape ({cols},), got {x.shape}")
    return matmul(layout, x[None], kind, bias)[0]


def matvec_reference(layout: GroupLayout, x: np.ndarray, kind: int = ACT_Q8_0) -> np.ndarray:
    """Plain numpy in float64: the scaled weights times x rounded as ``kind``, plus the mins
    times the rounded groups' sums (what the kernel multiplies them with) -> (rows,) float64."""
    values, group_sums = round_activations(np.asarray(x, np.float32)[None], kind, layout.group_size)
    scaled = GroupLayout(layout.q, layout.scales, None, layout.group_size)
    out = dequantize_reference(scaled).astype(np.float64) @ values[0].astype(np.float64)
    if layout.mins is not None:
        out += layout.mins.astype(np.float64) @ group_sums[0].astype(np.float64)
    return out
