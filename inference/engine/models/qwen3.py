"""Qwen3: the llama block without biases, with per-head RMS norms on q and k, NeoX RoPE."""

from __future__ import annotations

import numpy as np

from ..fused.step_kernels import QK_NORM
from ..kv_cache import KVCache
from .base import linear
from .layers import ROPE_NEOX, rms_norm
from .llama import LlamaModel


class Qwen3Model(LlamaModel):
    rope_style = ROPE_NEOX
    step_flags = QK_NORM

    def load_layer(self, i: int) -> dict:
        layer = super().load_layer(i)
        layer["attn_q_norm"] = self.vector(f"blk.{i}.attn_q_norm.weight")
        layer["attn_k_norm"] = self.vector(f"blk.{i}.attn_k_norm.weight")
        return layer

    def qk_norms(self, w: dict) -> tuple[np.ndarray, np.ndarray] | None:
        return w["attn_q_norm"], w["attn_k_norm"]

    def block(self, layer: int, x: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        w, c = self.layers[layer], self.config
        x = x + self.self_attention(layer, w, rms_norm(x, w["attn_norm"], c.norm_eps), cache, start)
        return x + self.feed_forward(w, rms_norm(x, w["ffn_norm"], c.norm_eps))

    def self_attention(self, layer: int, w: dict, h: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        c = self.config
        q, k, v = self.qkv_heads(w, h)
        q = rms_norm(q, w["attn_q_norm"], c.norm_eps)  # (n, heads, hd)
        k = rms_norm(k, w["attn_k_norm"], c.norm_eps)  # (n, kvh, hd)
        return linear(w["attn_output"], self.attend(layer, q, k, v, cache, start))
