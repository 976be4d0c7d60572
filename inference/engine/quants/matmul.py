"""Matrix product x @ W.T over a GroupLayout (the prefill path: many tokens at once).

Prefill is compute-bound, and BLAS's float32 GEMM runs 2-3x faster than the loop nests numba
vectorizes (measured on Qwen2.5's FFN at 256 tokens). So the token rows are rounded as ggml
would for the weight's format (quantize.py), then the weights are dequantized a slab of rows
at a time (q * scale, ~1 MB of float32 that stays in cache) and multiplied by BLAS. Mins are
factored out as in matvec.py: their term is the small product of the per-group sums of the
rounded input (Q8_1's f16 block sums, as ggml uses them) with the mins, so it keeps ggml's
arithmetic instead of folding the mins into the weights.

Threads: OpenBLAS's own pool splits every call statically and spin-waits, which collapsed to
a third of its speed when another process held a core. Instead the engine runs BLAS single-
threaded and gives slabs to its own threads (slabs.py): whoever is running takes the next one.
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from .layout import GroupLayout, dequantize_reference
from .quantize import ACT_NONE, round_activations
from .slabs import for_each_slab

SLAB_WEIGHTS = 1 << 18  # weights dequantized per BLAS call: 1 MB of float32


@functools.cache
def slab_kernel(group_shift: int):
    """Rows first..first+len(out) of q * scale (no mins) as float32, for groups of
    ``1 << group_shift`` (numba caches each variant on disk; runs without the GIL)."""

    @numba.njit(nogil=True, cache=True)
    def dequantize_slab(q, scales, first, out):
        for i in range(out.shape[0]):
            r = first + i
            for j in range(q.shape[1]):
                out[i, j] = np.float32(q[r, j]) * scales[r, j >> group_shift]

    return dequantize_slab


def matmul(
    layout: GroupLayout, x: np.ndarray, kind: int = ACT_NONE, bias: np.ndarray | None = None
) -> np.ndarray:
    """round(x) @ W.T (+ bias): x (n, cols) float32 -> (n, rows) float32."""
    rows, cols = layout.q.shape
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != cols:
        raise ValueError(f"matmul expects x of shape (n, {cols}), got {x.shape}")
    if x.shape[0] == 0:
        return np.empty((0, rows), np.float32)  # (0, rows)
    values, group_sums = round_activations(x, kind, layout.group_size)  # (n, cols), (n, groups)
    out = np.empty((x.shape[0], rows), np.float32)  # (n, rows)
    dequantize_slab = slab_kernel(layout.group_shift)
    slab_rows = max(16, SLAB_WEIGHTS // cols)

    def multiply(first: int, stop: int, scratch: np.ndarray) -> None:
        slab = scratch[: stop - first]  # (slab rows, cols)
        dequantize_slab(layout.q, layout.scales, first, slab)
        # A column block of out is still a BLAS matrix (leading dimension ``rows``).
        np.matmul(values, slab.T, out=out[:, first:stop])

    for_each_slab(rows, slab_rows, multiply, (slab_rows, cols))
    if layout.mins is not None:
        out += group_sums @ layout.mins.T  # (n, groups) @ (groups, rows)
    if bias is not None and bias.shape[0]:
        out += bias
    return out


def float_matmul(weights: np.ndarray, values: np.ndarray) -> np.ndarray:
    """values (n, cols) @ weights.T for float32 weights (rows, cols), by the same slab threads."""
    rows = weights.shape[0]
    out = np.empty((values.shape[0], rows), np.float32)  # (n, rows)

    def multiply(first: int, stop: int, scratch: np.ndarray) -> None:
        np.matmul(values, weights[first:stop].T, out=out[:, first:stop])

    for_each_slab(rows, max(16, SLAB_WEIGHTS // max(weights.shape[1], 1)), multiply, None)
    return out


def matmul_reference(layout: GroupLayout, x: np.ndarray) -> np.ndarray:
    """Plain numpy x @ W.T in float64 from the reference dequantization -> (n, rows) float64."""
    return np.asarray(x, np.float64) @ dequantize_reference(layout).astype(np.float64).T
