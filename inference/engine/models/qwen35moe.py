"""Qwen3.5-MoE (``qwen35moe``): Qwen3.5's hybrid layers with a mixture of SwiGLU experts plus
a gated shared expert in place of the dense FFN, as llama.cpp's ``qwen35moe`` graph builds it.

The router's softmax picks the top-k experts per token and their weights are renormalized to
sum to one; the k weighted outputs are summed in routing order. The shared expert (a SwiGLU
MLP of its own width) is scaled by sigmoid(``ffn_gate_inp_shexp`` . x) and added.
"""

from __future__ import annotations

import numpy as np

from ..gguf_file import GGUFError, GGUFFile
from .base import linear
from .deltanet import sigmoid
from .experts import routed_experts
from .gemma4_moe import softmax_rows
from .layers import silu
from .qwen35 import Qwen35Model

SHARED = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")


class Qwen35MoeModel(Qwen35Model):
    def config_overrides(self, f: GGUFFile) -> dict:
        return dict(
            n_experts=int(f.arch_value("expert_count", 0)),
            n_experts_used=int(f.arch_value("expert_used_count", 0)),
            n_ff_expert=int(f.arch_value("expert_feed_forward_length", 0)),
        )

    def load_ffn(self, i: int) -> dict:
        p, c = f"blk.{i}.", self.config
        if not 0 < c.n_experts_used <= c.n_experts:
            raise GGUFError(
                f"{self.file.path}: expert_used_count {c.n_experts_used} is not in 1..{c.n_experts}"
            )
        ffn = {"ffn_gate_inp": self.matrix(p + "ffn_gate_inp.weight")}  # (n_expert, n_embd)
        if self.file.has_tensor(p + "ffn_gate_up_exps.weight"):
            fused, n_ff = p + "ffn_gate_up_exps.weight", c.n_ff_expert
            ffn["gate_exps"] = routed_experts(self.file, fused, slice(0, n_ff))
            ffn["up_exps"] = routed_experts(self.file, fused, slice(n_ff, 2 * n_ff))
        else:
            ffn["gate_exps"] = routed_experts(self.file, p + "ffn_gate_exps.weight")
            ffn["up_exps"] = routed_experts(self.file, p + "ffn_up_exps.weight")
        ffn["down_exps"] = routed_experts(self.file, p + "ffn_down_exps.weight")
        if self.file.has_tensor(p + "ffn_up_shexp.weight"):
            ffn.update({name: self.matrix(f"{p}{name}.weight") for name in SHARED})
            ffn["shexp_gate"] = self.vector(p + "ffn_gate_inp_shexp.weight").reshape(-1)  # (n_embd,)
        return ffn

    def route(self, w: dict, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The chosen experts (n, k) and their renormalized weights (n, k) for rows h."""
        logits = np.ascontiguousarray(linear(w["ffn_gate_inp"], h), np.float32)  # (n, n_expert)
        probs = np.empty_like(logits)  # (n, n_expert)
        softmax_rows(logits, probs)
        top = np.argsort(-probs, axis=-1, kind="stable")[:, : self.config.n_experts_used]  # (n, k)
        weights = np.take_along_axis(probs, top, axis=-1)  # (n, k)
        return top, weights / weights.sum(axis=-1, keepdims=True, dtype=np.float32)

    def feed_forward(self, w: dict, h: np.ndarray) -> np.ndarray:
        top, weights = self.route(w, h)
        k = self.config.n_experts_used
        per_slot = np.zeros((h.shape[0], k, h.shape[1]), np.float32)  # (n, k, n_embd)
        for e in np.unique(top):
            rows, slot = np.nonzero(top == e)
            x = h[rows]  # (m, n_embd) the tokens routed to expert e
            y = linear(w["down_exps"][e], silu(linear(w["gate_exps"][e], x)) * linear(w["up_exps"][e], x))
            per_slot[rows, slot] = y * weights[rows, slot][:, None]
        out = per_slot[:, 0].copy()  # (n, n_embd)
        for slot in range(1, k):  # in routing order, as ggml adds the expert views
            out += per_slot[:, slot]
        if "ffn_up_shexp" not in w:
            return out
        shared = linear(
            w["ffn_down_shexp"], silu(linear(w["ffn_gate_shexp"], h)) * linear(w["ffn_up_shexp"], h)
        )
        gate = sigmoid((h * w["shexp_gate"]).sum(axis=-1))  # (n,) row by row, no BLAS
        return out + shared * gate[:, None]
