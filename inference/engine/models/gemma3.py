"""Gemma 3: scaled embeddings, q/k norms, pre and post norms around both sublayers, GeGLU,
and interleaved sliding-window (local) and global attention layers with their own RoPE bases.
"""

from __future__ import annotations

import numpy as np

from ..gguf_file import GGUFFile
from ..kv_cache import KVCache
from ..layers import ROPE_NEOX, gelu_tanh, rms_norm
from .base import DecoderModel, linear, stack_linears, stacked_linears
from .config import ModelConfig
from .fused import decode_layer_gemma, layer_projections

GLOBAL_EVERY = 6  # layers 5, 11, 17, ... attend globally; the rest use the sliding window
LOCAL_ROPE_BASE = 10000.0  # the architecture's value when the GGUF has no rope.freq_base_swa

NORMS = ("attn_norm", "attn_q_norm", "attn_k_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")
MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
QKV = ("attn_q", "attn_k", "attn_v")
GATE_UP = ("ffn_gate", "ffn_up")


class Gemma3Model(DecoderModel):
    rope_style = ROPE_NEOX

    def __init__(self, f: GGUFFile):
        config = ModelConfig.from_gguf(
            f,
            sliding_window=int(f.arch_value("attention.sliding_window", 0)),
            rope_base_local=float(f.arch_value("rope.freq_base_swa", LOCAL_ROPE_BASE)),
        )
        super().__init__(f, config)
        self.embed_scale = np.float32(np.sqrt(config.n_embd))
        self.layers = [self.load_layer(i) for i in range(config.n_layers)]
        # Per layer: the fused decode arguments, or None where the layer takes the numpy path.
        self.fused_layers = [self.fused_arguments(w) for w in self.layers]

    def load_layer(self, i: int) -> dict:
        layer = {name: self.matrix(f"blk.{i}.{name}.weight") for name in MATRICES}
        layer.update({name: self.vector(f"blk.{i}.{name}.weight") for name in NORMS})
        stack_linears(layer, QKV, "attn_qkv")
        stack_linears(layer, GATE_UP, "ffn_gate_up")
        return layer

    def fused_arguments(self, w: dict) -> tuple | None:
        """The weights of one layer as fused.decode_layer_gemma takes them, or None."""
        projections = layer_projections(w)
        if projections is None:
            return None
        c = self.config
        norms = np.stack([w[n] for n in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")])
        qk_norms = np.stack([w["attn_q_norm"], w["attn_k_norm"]])  # (2, hd)
        dims = (c.n_heads, c.n_kv_heads, c.head_dim_k, c.n_ff)
        return (norms, qk_norms, np.float32(c.norm_eps), *projections, dims)

    def fused_block(self, layer: int, x: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        norms, qk_norms, eps, qkv, out, gate_up, down, dims = self.fused_layers[layer]
        c, local = self.config, self.is_local(layer)
        cos, sin = self.rope_table(start, c.rope_base_local if local else c.rope_base)
        row = x[0].copy()  # (n_embd,)
        decode_layer_gemma(
            row,
            norms,
            qk_norms,
            eps,
            qkv,
            out,
            gate_up,
            down,
            dims,
            np.float32(1.0 / np.sqrt(c.head_dim_k)),
            cos,
            sin,
            c.sliding_window if local else 0,
            cache.k[layer],
            cache.v[layer],
            start,
        )
        return row[None, :]

    def is_local(self, layer: int) -> bool:
        return self.config.sliding_window > 0 and (layer + 1) % GLOBAL_EVERY != 0

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        return super().embed(tokens) * self.embed_scale  # (n, n_embd)

    def block(self, layer: int, x: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        if x.shape[0] == 1 and self.fused_layers is not None and self.fused_layers[layer] is not None:
            return self.fused_block(layer, x, cache, start)
        w, eps = self.layers[layer], self.config.norm_eps
        h = self.self_attention(layer, w, rms_norm(x, w["attn_norm"], eps), cache, start)
        x = x + rms_norm(h, w["post_attention_norm"], eps)
        h = rms_norm(x, w["ffn_norm"], eps)
        gate, up = stacked_linears(w, GATE_UP, "ffn_gate_up", h)
        h = linear(w["ffn_down"], gelu_tanh(gate) * up)
        return x + rms_norm(h, w["post_ffw_norm"], eps)

    def self_attention(self, layer: int, w: dict, h: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        c, local = self.config, self.is_local(layer)
        base = c.rope_base_local if local else c.rope_base
        q, k, v = stacked_linears(w, QKV, "attn_qkv", h)
        q = rms_norm(self.split_heads(q, c.n_heads), w["attn_q_norm"], c.norm_eps)  # (n, heads, hd)
        k = rms_norm(self.split_heads(k, c.n_kv_heads), w["attn_k_norm"], c.norm_eps)  # (n, kvh, hd)
        v = self.split_heads(v, c.n_kv_heads)  # (n, kvh, hd)
        window = c.sliding_window if local else 0
        out = self.attend(layer, q, k, v, cache, start, 1.0 / np.sqrt(c.head_dim_k), window, base)
        return linear(w["attn_output"], out)
