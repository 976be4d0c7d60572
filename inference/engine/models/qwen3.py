"""Qwen3: the llama block without biases, with per-head RMS norms on q and k, NeoX RoPE."""

from __future__ import annotations

import numpy as np

from ..kv_cache import KVCache
from ..layers import ROPE_NEOX, rms_norm
from .base import linear
from .llama import LlamaModel


class Qwen3Model(LlamaModel):
    rope_style = ROPE_NEOX

    def load_layer(self, i: int) -> dict:
        layer = super().load_layer(i)
        layer["attn_q_norm"] = self.vector(f"blk.{i}.attn_q_norm.weight")
        layer["attn_k_norm"] = self.vector(f"blk.{i}.attn_k_norm.weight")
        return layer

    def block(self, layer: int, x: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        w, c = self.layers[layer], self.config
        x = x + self.self_attention(layer, w, rms_norm(x, w["attn_norm"], c.norm_eps), cache, start)
        return x + self.feed_forward(w, rms_norm(x, w["ffn_norm"], c.norm_eps))

    def self_attention(self, layer: int, w: dict, h: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        c = self.config
        q = self.split_heads(linear(w["attn_q"], h), c.n_heads)  # (n, heads, hd)
        k = self.split_heads(linear(w["attn_k"], h), c.n_kv_heads)  # (n, kvh, hd)
        v = self.split_heads(linear(w["attn_v"], h), c.n_kv_heads)  # (n, kvh, hd)
        q = self.rope(rms_norm(q, w["attn_q_norm"], c.norm_eps), start)
        k = self.rope(rms_norm(k, w["attn_k_norm"], c.norm_eps), start)
        return linear(w["attn_output"], self.attend(layer, q, k, v, cache, start))
