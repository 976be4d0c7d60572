"""The differentiable steps of a decoder layer in float32 numpy, each a forward and a backward.

Backwards return the gradient of the inputs only (the weights are frozen). ``*_backward``
takes what its forward saved and the gradient of the forward's output.
"""

from __future__ import annotations

import math

import numpy as np

GELU_C = np.float32(math.sqrt(2.0 / math.pi))
GELU_A = np.float32(0.044715)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """y = x / rms(x) * weight over the last axis; returns y and the saved 1/rms (..., 1)."""
    inv = 1.0 / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + np.float32(eps))
    return (x * inv) * weight, inv.astype(x.dtype)


def rms_norm_backward(dy: np.ndarray, x: np.ndarray, weight: np.ndarray, inv: np.ndarray) -> np.ndarray:
    g = dy * weight  # gradient of the normalised x
    xhat = x * inv
    return inv * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool, inverse: bool = False) -> np.ndarray:
    """Rotate x (n, heads, head_dim) by per-row angles cos, sin (n, n_rot/2); ``inverse``
    rotates back, which is also the backward (a rotation's transpose is its inverse)."""
    half = cos.shape[1]
    out = np.array(x)
    if neox:
        a, b = x[..., :half], x[..., half : 2 * half]
        ia, ib = slice(0, half), slice(half, 2 * half)
    else:
        a, b = x[..., 0 : 2 * half : 2], x[..., 1 : 2 * half : 2]
        ia, ib = slice(0, 2 * half, 2), slice(1, 2 * half, 2)
    c, s = cos[:, None, :], (-sin if inverse else sin)[:, None, :]
    out[..., ia] = a * c - b * s
    out[..., ib] = a * s + b * c
    return out


def attention_mask(n: int, rows: int, window: int) -> np.ndarray:
    """True where query i (at position rows + i) may not see key j (prefix rows first, then the
    n tokens): the future, and with ``window`` > 0 anything ``window`` or more positions back."""
    q_pos = rows + np.arange(n)[:, None]
    k_pos = np.arange(rows + n)[None, :]
    masked = k_pos > q_pos
    if window > 0:
        masked |= q_pos - k_pos >= window
    return masked  # (n, rows + n)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float):
    """Grouped-query attention. q (heads, n, d); k, v (kv_heads, m, d) with the prefix rows
    first; mask (n, m). Returns out (heads, n, d) and the probabilities (heads, n, m)."""
    kvh = k.shape[0]
    group = q.shape[0] // kvh
    qg = q.reshape(kvh, group * q.shape[1], -1)  # (kvh, group*n, d)
    scores = np.matmul(qg, k.transpose(0, 2, 1)).reshape(q.shape[0], q.shape[1], -1) * np.float32(scale)
    scores = np.where(mask[None], np.float32(-np.inf), scores)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = np.matmul(probs.reshape(kvh, group * q.shape[1], -1), v)  # (kvh, group*n, d)
    return out.reshape(q.shape[0], q.shape[1], -1), probs


def attention_backward(dout, q, k, v, probs, scale):
    """Gradients of q (heads, n, d), k and v (kv_heads, m, d) from dout (heads, n, d)."""
    heads, n, _ = q.shape
    kvh = k.shape[0]
    group = heads // kvh
    do_g = dout.reshape(kvh, group * n, -1)
    p_g = probs.reshape(kvh, group * n, -1)  # (kvh, group*n, m)
    dv = np.matmul(p_g.transpose(0, 2, 1), do_g)  # (kvh, m, d)
    dp = np.matmul(do_g, v.transpose(0, 2, 1))  # (kvh, group*n, m)
    ds = p_g * (dp - np.sum(dp * p_g, axis=-1, keepdims=True)) * np.float32(scale)
    dq = np.matmul(ds, k).reshape(heads, n, -1)
    dk = np.matmul(ds.transpose(0, 2, 1), q.reshape(kvh, group * n, -1))  # (kvh, m, d)
    return dq, dk, dv


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return silu(gate) * up


def swiglu_backward(dy, gate, up):
    sig = 1.0 / (1.0 + np.exp(-gate))
    return dy * up * sig * (1.0 + gate * (1.0 - sig)), dy * gate * sig


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU's tanh approximation, unrounded (the serving path rounds it through f16)."""
    return 0.5 * x * (1.0 + np.tanh(GELU_C * (x + GELU_A * x * x * x)))


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return gelu_tanh(gate) * up


def geglu_backward(dy, gate, up):
    t = np.tanh(GELU_C * (gate + GELU_A * gate**3))
    dgelu = 0.5 * (1.0 + t) + 0.5 * gate * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * GELU_A * gate * gate)
    return dy * up * dgelu, dy * gelu_tanh(gate)


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(x / cap): no family the engine runs caps its logits today (Gemma 2 did);
    kept with its backward so a family that does plugs in."""
    return cap * np.tanh(x / cap)


def softcap_backward(dy: np.ndarray, y: np.ndarray, cap: float) -> np.ndarray:
    return dy * (1.0 - np.square(y / cap))
