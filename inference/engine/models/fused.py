"""A whole llama-family decoder layer for one token in one numba call.

At 100+ tokens per second a layer has ~200 us, and the dozens of numpy calls around the
products (norms, splits, SiLU, residual adds) cost tens of microseconds each layer. Here the
layer runs as: rms_norm -> q/k/v products -> RoPE + cache write + attention -> output product
+ residual -> rms_norm -> gate/up products -> SiLU * up -> down product + residual.
Every product rounds its input as ggml does (quantize.round_row), like the per-call kernels.

A linear is passed as a tuple ``(q, scales, mins, group_shift, has_mins, kind, bias)``; the
numpy path in llama.py (``LlamaModel.block``) is the reference the tests compare against.
"""

from __future__ import annotations

import numba
import numpy as np

from ..quants.layout import NO_MINS
from ..quants.matrix import GroupedMatrix
from ..quants.matvec import NO_BIAS
from ..quants.quantize import round_f16, round_row
from .kernels import decode_attention

SUPPORTED_GROUP_SHIFTS = (4, 5)  # groups of 16 and 32 weights: every block format's


def linear_spec(matrix: GroupedMatrix, bias: np.ndarray | None) -> tuple:
    """The tuple form of a grouped matrix the fused layer takes."""
    lay = matrix.layout
    if lay.group_shift not in SUPPORTED_GROUP_SHIFTS:
        raise ValueError(f"no fused kernel for groups of {lay.group_size}")
    mins = NO_MINS if lay.mins is None else lay.mins
    bias = NO_BIAS if bias is None else np.ascontiguousarray(bias, np.float32)
    return (lay.q, lay.scales, mins, lay.group_shift, lay.has_mins, matrix.activation_kind, bias)


def _linear_specs(w: dict, names: tuple[str, ...]) -> tuple | None:
    if not all(
        isinstance(w[n], GroupedMatrix) and w[n].layout.group_shift in SUPPORTED_GROUP_SHIFTS for n in names
    ):
        return None
    return tuple(linear_spec(w[n], w.get(n + "_bias")) for n in names)


def layer_projections(w: dict) -> tuple | None:
    """(qkv specs, output spec, gate/up specs, down spec) of a layer's weight dict, using the
    stacked matrices where the layer has them; None if a matrix is not block-quantized (float
    matrices take the numpy path)."""
    qkv = _linear_specs(w, ("attn_qkv",) if "attn_qkv" in w else ("attn_q", "attn_k", "attn_v"))
    gate_up = _linear_specs(w, ("ffn_gate_up",) if "ffn_gate_up" in w else ("ffn_gate", "ffn_up"))
    out, down = _linear_specs(w, ("attn_output",)), _linear_specs(w, ("ffn_down",))
    if qkv is None or gate_up is None or out is None or down is None:
        return None
    return qkv, out[0], gate_up, down[0]


def _matvec_rows_for(shift: int):
    """The row loop with the group shift as a compile-time constant: with a run-time shift
    the scale lookup ``j >> shift`` no longer vectorizes (measured 2.8x slower)."""

    @numba.njit(parallel=True, fastmath=True, cache=True)
    def matvec_rows(q, scales, mins, has_mins, values, group_sums, bias, out):
        rows, cols = q.shape
        for r in numba.prange(rows):
            acc = np.float32(0.0)
            for j in range(cols):
                acc += np.float32(q[r, j]) * scales[r, j >> shift] * values[j]
            if has_mins:
                for g in range(scales.shape[1]):
                    acc += mins[r, g] * group_sums[g]
            if bias.shape[0]:
                acc += bias[r]
            out[r] = acc

    return matvec_rows


_matvec_rows_16 = _matvec_rows_for(4)
_matvec_rows_32 = _matvec_rows_for(5)


@numba.njit(cache=True)
def apply_linear(spec, x, out):
    """out = W @ round(x) (+ bias) for one linear spec."""
    q, scales, mins, shift, has_mins, kind, bias = spec
    values = np.empty(x.shape[0], np.float32)  # (cols,)
    group_sums = np.zeros(scales.shape[1], np.float32)  # (groups,)
    round_row(kind, x, values, group_sums, 1 << shift, has_mins)
    if shift == 4:
        _matvec_rows_16(q, scales, mins, has_mins, values, group_sums, bias, out)
    else:
        _matvec_rows_32(q, scales, mins, has_mins, values, group_sums, bias, out)


@numba.njit(cache=True)
def rms_norm_row(x, weight, eps):
    """layers.rms_norm for one row: float32 squares summed in float64, the scale in float32."""
    total = 0.0
    for j in range(x.shape[0]):
        total += np.float64(x[j] * x[j])
    scale = np.float32(1.0) / np.sqrt(np.float32(total / x.shape[0]) + np.float32(eps))
    return (x * scale) * weight


@numba.njit(cache=True)
def _apply_all(specs, x, out):
    """Several linears on one input, outputs one after another in ``out``."""
    offset = 0
    for spec in specs:
        rows = spec[0].shape[0]
        apply_linear(spec, x, out[offset : offset + rows])
        offset += rows


@numba.njit(cache=True)
def decode_layer(
    x, norms, eps, qkv, out_proj, gate_up, down, dims, scale, cos, sin, neox, cache_k, cache_v, pos
):
    """One llama/qwen2 layer for one token at ``pos``; updates x (n_embd,) in place.

    norms: (2, n_embd) attn and ffn norm weights; qkv and gate_up: tuples of linear specs whose
    stacked outputs are q|k|v and gate|up; dims: (n_heads, n_kv_heads, head_dim, n_ff);
    scale: the attention's float32 score scale."""
    n_heads, n_kv, head_dim, n_ff = dims
    q_dim, kv_dim = n_heads * head_dim, n_kv * head_dim
    h = rms_norm_row(x, norms[0], eps)  # (n_embd,)
    qkv_out = np.empty(q_dim + 2 * kv_dim, np.float32)  # (q|k|v,)
    _apply_all(qkv, h, qkv_out)
    attn = np.empty((n_heads, head_dim), np.float32)  # (heads, hd)
    decode_attention(
        qkv_out[:q_dim].reshape(n_heads, head_dim),
        qkv_out[q_dim : q_dim + kv_dim].reshape(n_kv, head_dim),
        qkv_out[q_dim + kv_dim :].reshape(n_kv, head_dim),
        cos,
        sin,
        neox,
        cache_k,
        cache_v,
        pos,
        0,
        scale,
        attn,
    )
    projected = np.empty(x.shape[0], np.float32)  # (n_embd,)
    apply_linear(out_proj, attn.reshape(-1), projected)
    x += projected
    h = rms_norm_row(x, norms[1], eps)
    gu = np.empty(2 * n_ff, np.float32)  # (gate|up,)
    _apply_all(gate_up, h, gu)
    act = gu[:n_ff] / (np.float32(1.0) + np.exp(-gu[:n_ff])) * gu[n_ff:]  # (n_ff,) silu(gate) * up
    apply_linear(down, act, projected)
    x += projected


@numba.njit(cache=True)
def gelu_tanh_f16(x):
    """layers.gelu_tanh for a vector: the tanh approximation evaluated on f16-rounded inputs."""
    c, half, one, cubic = (
        np.float32(np.sqrt(2.0 / np.pi)),
        np.float32(0.5),
        np.float32(1.0),
        np.float32(0.044715),
    )
    out = np.empty_like(x)  # (n,)
    for i in range(x.shape[0]):
        v = x[i]
        if v <= np.float32(-10.0):
            out[i] = 0.0
        elif v >= np.float32(10.0):
            out[i] = v
        else:
            v16 = round_f16(v)
            out[i] = round_f16(half * v16 * (one + np.tanh(c * v16 * (one + cubic * v16 * v16))))
    return out


@numba.njit(cache=True)
def decode_layer_gemma(
    x,
    norms,
    qk_norms,
    eps,
    qkv,
    out_proj,
    gate_up,
    down,
    dims,
    scale,
    cos,
    sin,
    window,
    cache_k,
    cache_v,
    pos,
):
    """One Gemma 3 layer for one token at ``pos``; updates x (n_embd,) in place.

    norms: (4, n_embd) attn, post-attention, ffn and post-ffn norm weights; qk_norms: (2, hd)
    the per-head q and k norms; the rest as in decode_layer (RoPE is always NeoX here)."""
    n_heads, n_kv, head_dim, n_ff = dims
    q_dim, kv_dim = n_heads * head_dim, n_kv * head_dim
    h = rms_norm_row(x, norms[0], eps)  # (n_embd,)
    qkv_out = np.empty(q_dim + 2 * kv_dim, np.float32)  # (q|k|v,)
    _apply_all(qkv, h, qkv_out)
    q = qkv_out[:q_dim].reshape(n_heads, head_dim)
    k = qkv_out[q_dim : q_dim + kv_dim].reshape(n_kv, head_dim)
    for i in range(n_heads):
        q[i] = rms_norm_row(q[i], qk_norms[0], eps)
    for i in range(n_kv):
        k[i] = rms_norm_row(k[i], qk_norms[1], eps)
    attn = np.empty((n_heads, head_dim), np.float32)  # (heads, hd)
    v = qkv_out[q_dim + kv_dim :].reshape(n_kv, head_dim)
    decode_attention(q, k, v, cos, sin, True, cache_k, cache_v, pos, window, scale, attn)
    projected = np.empty(x.shape[0], np.float32)  # (n_embd,)
    apply_linear(out_proj, attn.reshape(-1), projected)
    x += rms_norm_row(projected, norms[1], eps)
    h = rms_norm_row(x, norms[2], eps)
    gu = np.empty(2 * n_ff, np.float32)  # (gate|up,)
    _apply_all(gate_up, h, gu)
    apply_linear(down, gelu_tanh_f16(gu[:n_ff]) * gu[n_ff:], projected)
    x += rms_norm_row(projected, norms[3], eps)
