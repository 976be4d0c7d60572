"""Qwen3-MoE: Qwen3 attention with a routed mixture of SwiGLU experts in place of the FFN.

The router's softmax picks the top-k experts per token; their weights are renormalized to
sum to one (``norm_topk_prob``), as llama.cpp does for this family.
"""

from __future__ import annotations

import numpy as np

from ..gguf_file import GGUFFile
from .base import DecoderModel, linear
from .config import ModelConfig
from .experts import routed_experts
from .layers import silu
from .qwen3 import Qwen3Model

EXPERT_MATRICES = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


class Qwen3MoeModel(Qwen3Model):
    MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output")

    def __init__(self, f: GGUFFile):
        config = ModelConfig.from_gguf(
            f,
            n_experts=int(f.arch_value("expert_count", 0)),
            n_experts_used=int(f.arch_value("expert_used_count", 0)),
            n_ff_expert=int(f.arch_value("expert_feed_forward_length", 0)),
        )
        super().__init__(f, config)

    # Routed experts: the fused step has no stage for them. The base's step_layers (None) also
    # makes may_fuse() false: a cold start compiles no fused forward ahead, --batch is refused.
    step_layers = DecoderModel.step_layers

    def load_layer(self, i: int) -> dict:
        layer = super().load_layer(i)
        layer["ffn_gate_inp"] = self.matrix(f"blk.{i}.ffn_gate_inp.weight")
        for name in EXPERT_MATRICES:
            layer[name] = routed_experts(self.file, f"blk.{i}.{name}.weight")  # n_expert x (rows, cols)
        return layer

    def feed_forward(self, w: dict, h: np.ndarray) -> np.ndarray:
        c = self.config
        router = linear(w["ffn_gate_inp"], h)  # (n, n_experts)
        probs = np.exp(router - router.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        top = np.argsort(-probs, axis=-1, kind="stable")[:, : c.n_experts_used]  # (n, k)
        weights = np.take_along_axis(probs, top, axis=-1)  # (n, k)
        weights /= weights.sum(axis=-1, keepdims=True)
        out = np.zeros_like(h)  # (n, n_embd)
        for e in np.unique(top):
            rows, slot = np.nonzero(top == e)
            x = h[rows]  # (m, n_embd) tokens routed to expert e
            y = silu(linear(w["ffn_gate_exps"][e], x)) * linear(w["ffn_up_exps"][e], x)
            out[rows] += weights[rows, slot][:, None] * linear(w["ffn_down_exps"][e], y)
        return out
