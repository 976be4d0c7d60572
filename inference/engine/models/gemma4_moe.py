"""Gemma 4's mixture-of-experts feed-forward, beside the always-on dense GeGLU MLP.

As llama.cpp's graph computes it: the router reads the unweighted RMS norm of the residual
stream, scaled by 1/sqrt(n_embd) and by a learned per-channel scale; its softmax picks the
top-k experts, whose weights are renormalized to sum to one. Each expert is a GeGLU MLP
(gate and up fused in one tensor in the released files, or separate) whose output is scaled
by the expert's own ``ffn_down_exps.scale`` and then by its routing weight; the k outputs are
summed in routing order, so a token's result does not depend on which others share the batch.
"""

from __future__ import annotations

import numba
import numpy as np

from ..fused.ggml_math import expf_ggml
from ..fused.rowops import gelu_tanh_f16
from ..gguf_file import GGUFError, GGUFFile
from ..quants import QuantMatrix, load_matrix
from .base import linear
from .experts import repacked_experts, routed_experts
from .layers import rms_norm

ONES = np.float32(1.0)


def expert_matrices(f: GGUFFile, name: str, row_range: slice | None = None) -> list[QuantMatrix]:
    """One matrix per expert of a 3-D tensor (n_expert, rows, cols), optionally a row range
    of each (the gate or up half of a fused gate_up tensor), all repacked now (shared experts,
    used by every token, are never borrowed)."""
    t = f.tensor(name)
    rows = range(t.shape[1])[row_range] if row_range is not None else range(t.shape[1])
    return repacked_experts(t, rows)


class ExpertFFN:
    """One layer's routed experts (the MoE half of a Gemma 4 MoE layer's feed-forward)."""

    def __init__(self, f: GGUFFile, layer: int, n_used: int, n_ff: int):
        p = f"blk.{layer}."
        t = f.tensor(p + "ffn_gate_inp.weight")
        self.router = load_matrix(t.type, t.data, t.shape, t.name)  # (n_expert, n_embd)
        self.router_scale = np.asarray(f.tensor(p + "ffn_gate_inp.scale").data, np.float32)  # (n_embd,)
        n_expert = self.router.rows
        if not 0 < n_used <= n_expert:
            raise GGUFError(f"{f.path}: expert_used_count {n_used} is not in 1..{n_expert}")
        if f.has_tensor(p + "ffn_gate_up_exps.weight"):
            fused = p + "ffn_gate_up_exps.weight"
            self.gate = routed_experts(f, fused, slice(0, n_ff))
            self.up = routed_experts(f, fused, slice(n_ff, 2 * n_ff))
        else:
            self.gate = routed_experts(f, p + "ffn_gate_exps.weight")
            self.up = routed_experts(f, p + "ffn_up_exps.weight")
        self.down = routed_experts(f, p + "ffn_down_exps.weight")
        scale_name = p + "ffn_down_exps.scale"
        self.down_scale = (
            np.asarray(f.tensor(scale_name).data, np.float32).reshape(-1)
            if f.has_tensor(scale_name)
            else np.ones(n_expert, np.float32)
        )  # (n_expert,)
        self.n_used = n_used

    def route(self, x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
        """The chosen experts (n, k) and their renormalized weights (n, k) for residual rows x."""
        n_embd = x.shape[-1]
        h = rms_norm(x, ONES, eps) * np.float32(1.0 / np.sqrt(np.float32(n_embd)))
        logits = linear(self.router, h * self.router_scale)  # (n, n_expert)
        probs = np.empty_like(logits)
        softmax_rows(np.ascontiguousarray(logits, np.float32), probs)
        top = np.argsort(-probs, axis=-1, kind="stable")[:, : self.n_used]  # (n, k)
        weights = np.take_along_axis(probs, top, axis=-1)  # (n, k)
        return top, weights / weights.sum(axis=-1, keepdims=True, dtype=np.float32)

    def __call__(self, x: np.ndarray, h: np.ndarray, eps: float) -> np.ndarray:
        """The experts' mixture for rows h (n, n_embd) (already pre-normed), routed on x."""
        top, weights = self.route(x, eps)
        per_slot = np.zeros((h.shape[0], self.n_used, h.shape[1]), np.float32)  # (n, k, n_embd)
        for e in np.unique(top):
            rows, slot = np.nonzero(top == e)
            rows_h = h[rows]  # (m, n_embd) the tokens routed to expert e
            act = gelu_tanh_f16(linear(self.gate[e], rows_h)) * linear(self.up[e], rows_h)
            y = linear(self.down[e], act) * self.down_scale[e]  # (m, n_embd)
            per_slot[rows, slot] = y * weights[rows, slot][:, None]
        out = per_slot[:, 0].copy()  # (n, n_embd)
        for slot in range(1, self.n_used):  # in routing order, as ggml adds the expert views
            out += per_slot[:, slot]
        return out


@numba.njit(cache=True)
def softmax_rows(x, out):
    """Softmax of each row of x (n, k): ggml's expf, the sum in float64, times 1/sum."""
    for r in range(x.shape[0]):
        top = x[r].max()
        total = 0.0
        for j in range(x.shape[1]):
            out[r, j] = expf_ggml(x[r, j] - top)
            total += np.float64(out[r, j])
        inverse = np.float32(1.0 / total)
        for j in range(x.shape[1]):
            out[r, j] *= inverse
