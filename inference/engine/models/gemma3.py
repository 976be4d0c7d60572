"""Gemma 3: scaled embeddings, q/k norms, pre and post norms around both sublayers, GeGLU,
and interleaved sliding-window (local) and global attention layers with their own RoPE bases.
"""

from __future__ import annotations

import numpy as np

from ..gguf_file import GGUFFile
from ..kv_cache import KVCache
from ..layers import ROPE_NEOX, gelu_tanh, rms_norm
from .base import DecoderModel, linear
from .config import ModelConfig

GLOBAL_EVERY = 6  # layers 5, 11, 17, ... attend globally; the rest use the sliding window
LOCAL_ROPE_BASE = 10000.0  # fixed by the architecture, not stored in the GGUF

NORMS = ("attn_norm", "attn_q_norm", "attn_k_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")
MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


class Gemma3Model(DecoderModel):
    rope_style = ROPE_NEOX

    def __init__(self, f: GGUFFile):
        config = ModelConfig.from_gguf(
            f,
            sliding_window=int(f.arch_value("attention.sliding_window", 0)),
            rope_base_local=LOCAL_ROPE_BASE,
        )
        super().__init__(f, config)
        self.embed_scale = np.float32(np.sqrt(config.n_embd))
        self.layers = [self.load_layer(i) for i in range(config.n_layers)]

    def load_layer(self, i: int) -> dict:
        layer = {name: self.matrix(f"blk.{i}.{name}.weight") for name in MATRICES}
        layer.update({name: self.vector(f"blk.{i}.{name}.weight") for name in NORMS})
        return layer

    def is_local(self, layer: int) -> bool:
        return self.config.sliding_window > 0 and (layer + 1) % GLOBAL_EVERY != 0

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        return super().embed(tokens) * self.embed_scale  # (n, n_embd)

    def block(self, layer: int, x: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        w, eps = self.layers[layer], self.config.norm_eps
        h = self.self_attention(layer, w, rms_norm(x, w["attn_norm"], eps), cache, start)
        x = x + rms_norm(h, w["post_attention_norm"], eps)
        h = rms_norm(x, w["ffn_norm"], eps)
        h = linear(w["ffn_down"], gelu_tanh(linear(w["ffn_gate"], h)) * linear(w["ffn_up"], h))
        return x + rms_norm(h, w["post_ffw_norm"], eps)

    def self_attention(self, layer: int, w: dict, h: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        c, local = self.config, self.is_local(layer)
        base = c.rope_base_local if local else c.rope_base
        q = self.split_heads(linear(w["attn_q"], h), c.n_heads)  # (n, heads, hd)
        k = self.split_heads(linear(w["attn_k"], h), c.n_kv_heads)  # (n, kvh, hd)
        v = self.split_heads(linear(w["attn_v"], h), c.n_kv_heads)  # (n, kvh, hd)
        q = self.rope(rms_norm(q, w["attn_q_norm"], c.norm_eps), start, base)
        k = self.rope(rms_norm(k, w["attn_k_norm"], c.norm_eps), start, base)
        window = c.sliding_window if local else 0
        out = self.attend(layer, q, k, v, cache, start, 1.0 / np.sqrt(c.head_dim_k), window)
        return linear(w["attn_output"], out)
