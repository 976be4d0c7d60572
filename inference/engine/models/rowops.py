"""Element-wise steps of a decoder layer on one row, in numba, as layers.py computes them."""

from __future__ import annotations

import numba
import numpy as np

from ..quants.quantize import round_f16
from .kernels import round_f16_inplace


@numba.njit(cache=True)
def rms_norm_into(x, weight, eps, out):
    """out = layers.rms_norm of one row: float32 squares summed in float64, the scale in float32.
    ``out`` may be ``x``."""
    total = 0.0
    for j in range(x.shape[0]):
        total += np.float64(x[j] * x[j])
    scale = np.float32(1.0) / np.sqrt(np.float32(total / x.shape[0]) + np.float32(eps))
    for j in range(x.shape[0]):
        out[j] = (x[j] * scale) * weight[j]


@numba.njit(cache=True)
def rms_norm_row(x, weight, eps):
    """rms_norm_into a new row."""
    out = np.empty_like(x)  # (n,)
    rms_norm_into(x, weight, eps, out)
    return out


@numba.njit(cache=True)
def silu_one(g):
    """x * sigmoid(x) of one float32 value."""
    return g / (np.float32(1.0) + np.exp(-g))


@numba.njit(cache=True)
def silu_into(x, out):
    for i in range(x.shape[0]):
        out[i] = silu_one(x[i])


@numba.njit(cache=True)
def gelu_f16(v):
    """layers.gelu_tanh of one value: the tanh approximation evaluated on f16-rounded inputs."""
    if v <= np.float32(-10.0):
        return np.float32(0.0)
    if v >= np.float32(10.0):
        return v
    c, half, one, cubic = np.float32(np.sqrt(2.0 / np.pi)), np.float32(0.5), np.float32(1.0), np.float32(0.044715)
    v16 = round_f16(v)
    return round_f16(half * v16 * (one + np.tanh(c * v16 * (one + cubic * v16 * v16))))


@numba.njit(parallel=True, cache=True)
def _gelu_rows(x, out):
    # gelu_f16 row by row, with the f16 roundings done by bit manipulation on whole rows
    # (round_f16 per value goes through float64 frexp: ~10 ns a value).
    c, half, one, cubic = np.float32(np.sqrt(2.0 / np.pi)), np.float32(0.5), np.float32(1.0), np.float32(0.044715)
    for i in numba.prange(x.shape[0]):
        row = out[i]
        row[:] = x[i]
        round_f16_inplace(row)
        for j in range(row.shape[0]):
            v16 = row[j]
            row[j] = half * v16 * (one + np.tanh(c * v16 * (one + cubic * v16 * v16)))
        round_f16_inplace(row)
        for j in range(row.shape[0]):
            if x[i, j] <= np.float32(-10.0):
                row[j] = 0.0
            elif x[i, j] >= np.float32(10.0):
                row[j] = x[i, j]


def gelu_tanh_f16(x: np.ndarray) -> np.ndarray:
    """gelu_f16 over an array (..., n), rows in parallel: the numpy reference (layers.gelu_tanh)
    spends most of its time converting to and from float16."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)  # (..., n)
    _gelu_rows(x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1]))
    return out
