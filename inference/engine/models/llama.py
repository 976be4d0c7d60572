"""Llama (SmolLM2 and friends): pre-norm blocks, GQA attention, SwiGLU, adjacent-pair RoPE."""

from __future__ import annotations

import numpy as np

from ..gguf_file import GGUFFile
from ..kv_cache import KVCache
from ..layers import ROPE_NORM, rms_norm, silu
from .base import DecoderModel, linear
from .config import ModelConfig


class LlamaModel(DecoderModel):
    rope_style = ROPE_NORM
    has_qkv_bias = False

    def __init__(self, f: GGUFFile, config: ModelConfig | None = None):
        super().__init__(f, config or ModelConfig.from_gguf(f))
        self.layers = [self.load_layer(i) for i in range(self.config.n_layers)]

    def load_layer(self, i: int) -> dict:
        p = f"blk.{i}."
        layer = {name: self.matrix(p + name + ".weight") for name in self.MATRICES}
        layer["attn_norm"] = self.vector(p + "attn_norm.weight")
        layer["ffn_norm"] = self.vector(p + "ffn_norm.weight")
        for name in ("attn_q", "attn_k", "attn_v"):
            layer[name + "_bias"] = self.optional_vector(p + name + ".bias")
        return layer

    MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")

    def block(self, layer: int, x: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        w, c = self.layers[layer], self.config
        h = rms_norm(x, w["attn_norm"], c.norm_eps)  # (n, n_embd)
        q = self.split_heads(linear(w["attn_q"], h, w["attn_q_bias"]), c.n_heads)  # (n, heads, hd)
        k = self.split_heads(linear(w["attn_k"], h, w["attn_k_bias"]), c.n_kv_heads)  # (n, kvh, hd)
        v = self.split_heads(linear(w["attn_v"], h, w["attn_v_bias"]), c.n_kv_heads)  # (n, kvh, hd)
        q, k = self.rope(q, start), self.rope(k, start)
        x = x + linear(w["attn_output"], self.attend(layer, q, k, v, cache, start))
        h = rms_norm(x, w["ffn_norm"], c.norm_eps)
        return x + self.feed_forward(w, h)

    def feed_forward(self, w: dict, h: np.ndarray) -> np.ndarray:
        return linear(w["ffn_down"], silu(linear(w["ffn_gate"], h)) * linear(w["ffn_up"], h))
