"""The building blocks every decoder family shares: norms, rotary embeddings, attention.

Where llama.cpp rounds (its default KV cache is f16, and it feeds attention f16 operands),
we round the same way, so that logits agree to float noise rather than to f16 noise.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ..fused.kernels import rope_rows
from ..fused.rowops import silu_one
from ..kv_cache import KVCache

ROPE_NORM = "norm"  # rotate adjacent pairs (x0, x1), (x2, x3) ... — llama
ROPE_NEOX = "neox"  # rotate halves (x_i, x_{i+d/2}) — qwen2/3, gemma3


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """Normalize the last axis to unit RMS and scale by ``weight``.

    As in ggml: float32 squares summed in float64, the scale computed in float32. The next
    product quantizes the result to int8, where a last-bit difference can flip a rounding."""
    mean_sq = np.sum(np.square(x, dtype=np.float32), axis=-1, keepdims=True, dtype=np.float64) / x.shape[-1]
    scale = np.float32(1.0) / np.sqrt(mean_sq.astype(np.float32) + np.float32(eps))
    return (x * scale) * weight


@numba.njit(cache=True)
def silu_into(x, out):
    """silu_one over each row of x (rows, n)."""
    for r in range(x.shape[0]):
        vector_end = x.shape[1] - x.shape[1] % 8
        for i in range(x.shape[1]):
            out[r, i] = silu_one(x[r, i], i < vector_end)


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x) in float32 over the last axis, as llama.cpp's SwiGLU computes it (silu_one)."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)  # (..., n)
    silu_into(x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1]))
    return out


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU with the tanh approximation, through f16 like llama.cpp's lookup table."""
    x16 = x.astype(np.float16).astype(np.float32)
    c = np.float32(math.sqrt(2.0 / math.pi))
    y = 0.5 * x16 * (1.0 + np.tanh(c * x16 * (1.0 + np.float32(0.044715) * x16 * x16)))
    y = y.astype(np.float16).astype(np.float32)
    return np.where(x <= -10.0, np.float32(0.0), np.where(x >= 10.0, x, y)).astype(np.float32)


def to_f16_precision(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


@numba.njit(cache=True)
def rope_table_into(positions, n_rot, base, cos, sin):
    """cos, sin (n, n_rot/2) of each position as ggml computes them: theta starts at the
    position and is multiplied by base ** (-2 / n_rot) pair after pair, all in float32."""
    theta_scale = np.float32(base) ** (np.float32(-2.0) / np.float32(n_rot))
    for i in range(positions.shape[0]):
        theta = np.float32(positions[i])
        for j in range(n_rot // 2):
            cos[i, j] = np.cos(theta)
            sin[i, j] = np.sin(theta)
            theta = theta * theta_scale


def rope_angles(positions: np.ndarray, n_rot: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (n, n_rot/2) of each (position, pair) angle, computed as ggml does in
    float32: the angle starts at the position and is multiplied by ``base ** (-2 / n_rot)``
    pair after pair; cosf and sinf of each."""
    positions = np.ascontiguousarray(positions, np.int64).reshape(-1)
    cos = np.empty((positions.shape[0], n_rot // 2), np.float32)  # (n, n_rot/2)
    sin = np.empty_like(cos)  # (n, n_rot/2)
    rope_table_into(positions, n_rot, float(base), cos, sin)
    return cos, sin


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, style: str) -> np.ndarray:
    """Rotate ``x`` (n, heads, head_dim) by the angles of its positions (n, n_rot/2), with the
    fused multiply-adds of ggml's rotate_pairs (fused/kernels.rope_inplace)."""
    out = np.array(x, np.float32)  # (n, heads, head_dim)
    rope_rows(
        out, np.ascontiguousarray(cos, np.float32), np.ascontiguousarray(sin, np.float32), style == ROPE_NEOX
    )
    return out


def attention(
    q: np.ndarray, cache: KVCache, layer: int, start: int, scale: float, window: int = 0
) -> np.ndarray:
    """Causal attention of queries at positions ``start..start+n`` over cached rows ``0..start+n``.

    q: (n, n_heads, head_dim). Returns (n, n_heads, head_dim_v). ``window`` > 0 limits each
    query to the ``window`` most recent positions (sliding-window layers).
    """
    n, n_heads, _ = q.shape
    end = start + n
    keys = cache.k[layer, :, :end]  # (kvh, end, hd)
    values = cache.v[layer, :, :end]  # (kvh, end, hd_v)
    n_kv = keys.shape[0]
    group = n_heads // n_kv
    q16 = to_f16_precision(q).transpose(1, 0, 2).reshape(n_kv, group * n, -1)  # (kvh, group*n, hd)
    scores = np.matmul(q16, keys.transpose(0, 2, 1)) * np.float32(scale)  # (kvh, group*n, end)
    scores = scores.reshape(n_kv, group, n, end)
    q_pos = np.arange(start, end)[:, None]  # (n, 1)
    k_pos = np.arange(end)[None, :]  # (1, end)
    masked = k_pos > q_pos
    if window > 0:
        masked |= q_pos - k_pos >= window
    scores = np.where(masked, np.float32(-np.inf), scores)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    probs = to_f16_precision(probs).reshape(n_kv, group * n, end)
    out = np.matmul(probs, values)  # (kvh, group*n, hd_v)
    return out.reshape(n_heads, n, -1).transpose(1, 0, 2).astype(np.float32)  # (n, n_heads, hd_v)
