"""Activations rounded the way ggml rounds them before a quantized dot product.

ggml never multiplies a quantized weight by a float32 activation: it first quantizes the
activation row to the weight format's partner type (Q8_0, Q8_1 or Q8_K; F16 or BF16 for
float weights) and takes integer dot products per block. Feeding our kernels the same
rounded values makes our logits agree with llama.cpp's to float noise (a one-layer SmolLM2
forward then matches to ~4e-7 relative, against ~2e-3 with unrounded activations).

Each function maps x (..., cols) float32 to the float32 values ggml's integer arithmetic
represents, so any kernel (int8 dot or BLAS) can consume them.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import numpy as np

T = gguf.GGMLQuantizationType


@dataclass(frozen=True)
class RoundedActivations:
    """x as ggml sees it, plus what Q8_1 keeps besides: per-block f16 sums ``s``."""

    values: np.ndarray  # (..., cols) float32: q * d
    sum_error: np.ndarray | None = None  # (..., cols/32) float32: f16(d*sum q) - f16(d)*sum q


def _blocks(x: np.ndarray, size: int) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x.reshape(*x.shape[:-1], x.shape[-1] // size, size)  # (..., n_blocks, size)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _q8_blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q8_0/Q8_1 quantization of 32-wide blocks: q = round(x * 127 / amax), d = amax / 127."""
    xb = _blocks(x, 32)  # (..., nb, 32)
    amax = np.abs(xb).max(axis=-1)  # (..., nb)
    d = amax / np.float32(127.0)
    inv = np.divide(np.float32(127.0), amax, out=np.zeros_like(amax), where=amax != 0)
    q = np.rint(xb * inv[..., None])  # (..., nb, 32) integers in [-127, 127]
    return q, d, xb


def round_q8_0(x: np.ndarray) -> RoundedActivations:
    q, d, _ = _q8_blocks(x)
    values = q * _f16(d)[..., None]
    return RoundedActivations(values.reshape(x.shape))


def round_q8_1(x: np.ndarray) -> RoundedActivations:
    """Q8_1 also stores s = f16(d * sum(q)); the weight's min term multiplies s, not the
    sum of the rounded values, so the difference is returned for the caller to add."""
    q, d, _ = _q8_blocks(x)
    d16 = _f16(d)
    qsum = q.sum(axis=-1)  # (..., nb)
    values = q * d16[..., None]
    return RoundedActivations(values.reshape(x.shape), _f16(d * qsum) - d16 * qsum)


def round_q8_k(x: np.ndarray) -> RoundedActivations:
    """Q8_K: 256-wide blocks scaled by the signed extreme, d kept in float32."""
    xb = _blocks(x, 256)  # (..., nb, 256)
    idx = np.abs(xb).argmax(axis=-1)[..., None]
    extreme = np.take_along_axis(xb, idx, axis=-1)[..., 0]  # (..., nb) signed max-magnitude value
    iscale = np.divide(np.float32(-127.0), extreme, out=np.zeros_like(extreme), where=extreme != 0)
    q = np.minimum(np.rint(xb * iscale[..., None]), 127)  # (..., nb, 256)
    d = np.divide(np.float32(1.0), iscale, out=np.zeros_like(iscale), where=iscale != 0)
    return RoundedActivations((q * d[..., None]).reshape(x.shape))


def round_f16(x: np.ndarray) -> RoundedActivations:
    return RoundedActivations(_f16(np.asarray(x, np.float32)))


def round_bf16(x: np.ndarray) -> RoundedActivations:
    """Round to nearest even bfloat16, as ggml's FP32_TO_BF16 does."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) & np.uint32(0xFFFF0000)
    return RoundedActivations(rounded.view(np.float32))


def round_none(x: np.ndarray) -> RoundedActivations:
    return RoundedActivations(np.asarray(x, np.float32))


# The activation type ggml pairs with each weight type (its vec_dot_type).
ACTIVATION_ROUNDING = {
    T.F32: round_none,
    T.F16: round_f16,
    T.BF16: round_bf16,
    T.Q4_0: round_q8_0,
    T.Q5_0: round_q8_0,
    T.Q8_0: round_q8_0,
    T.Q4_1: round_q8_1,
    T.Q5_1: round_q8_1,
    T.Q2_K: round_q8_k,
    T.Q3_K: round_q8_k,
    T.Q4_K: round_q8_k,
    T.Q5_K: round_q8_k,
    T.Q6_K: round_q8_k,
}
