"""Llama (SmolLM2 and friends): pre-norm blocks, GQA attention, SwiGLU, adjacent-pair RoPE."""

from __future__ import annotations

import numpy as np

from ..gguf_file import GGUFFile
from ..kv_cache import KVCache
from ..layers import ROPE_NEOX, ROPE_NORM, rms_norm, silu
from .base import DecoderModel, linear, stack_linears, stacked_linears
from .config import ModelConfig
from .fused import decode_layer, layer_projections

QKV = ("attn_q", "attn_k", "attn_v")
GATE_UP = ("ffn_gate", "ffn_up")


class LlamaModel(DecoderModel):
    rope_style = ROPE_NORM
    has_qkv_bias = False
    fused_decode = True  # whether block() is exactly what fused.decode_layer computes

    def __init__(self, f: GGUFFile, config: ModelConfig | None = None):
        super().__init__(f, config or ModelConfig.from_gguf(f))
        self.layers = [self.load_layer(i) for i in range(self.config.n_layers)]
        # Per layer: the fused decode arguments, or None where the layer takes the numpy path.
        self.fused_layers = [self.fused_arguments(w) for w in self.layers] if self.fused_decode else None

    def fused_arguments(self, w: dict) -> tuple | None:
        """The weights of one layer as fused.decode_layer takes them, or None."""
        projections = layer_projections(w)
        if projections is None:
            return None
        c = self.config
        norms = np.stack([w["attn_norm"], w["ffn_norm"]])  # (2, n_embd)
        dims = (c.n_heads, c.n_kv_heads, c.head_dim_k, c.n_ff)
        return (norms, np.float32(c.norm_eps), *projections, dims)

    def fused_block(self, layer: int, x: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        norms, eps, qkv, out, gate_up, down, dims = self.fused_layers[layer]
        cos, sin = self.rope_table(start, None)
        scale = np.float32(1.0 / np.sqrt(self.config.head_dim_k))
        row = x[0].copy()  # (n_embd,)
        decode_layer(
            row,
            norms,
            eps,
            qkv,
            out,
            gate_up,
            down,
            dims,
            scale,
            cos,
            sin,
            self.rope_style == ROPE_NEOX,
            cache.k[layer],
            cache.v[layer],
            start,
        )
        return row[None, :]

    def load_layer(self, i: int) -> dict:
        p = f"blk.{i}."
        layer = {name: self.matrix(p + name + ".weight") for name in self.MATRICES}
        layer["attn_norm"] = self.vector(p + "attn_norm.weight")
        layer["ffn_norm"] = self.vector(p + "ffn_norm.weight")
        for name in ("attn_q", "attn_k", "attn_v"):
            layer[name + "_bias"] = self.optional_vector(p + name + ".bias")
        stack_linears(layer, QKV, "attn_qkv")
        if "ffn_gate" in layer:
            stack_linears(layer, GATE_UP, "ffn_gate_up")
        return layer

    MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")

    def block(self, layer: int, x: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        if x.shape[0] == 1 and self.fused_layers is not None and self.fused_layers[layer] is not None:
            return self.fused_block(layer, x, cache, start)
        w, c = self.layers[layer], self.config
        h = rms_norm(x, w["attn_norm"], c.norm_eps)  # (n, n_embd)
        q, k, v = self.qkv_heads(w, h)
        x = x + linear(w["attn_output"], self.attend(layer, q, k, v, cache, start))
        h = rms_norm(x, w["ffn_norm"], c.norm_eps)
        return x + self.feed_forward(w, h)

    def qkv_heads(self, w: dict, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q (n, heads, hd), k and v (n, kvh, hd) of the normed input h, before RoPE."""
        c = self.config
        q, k, v = stacked_linears(w, QKV, "attn_qkv", h)
        return (
            self.split_heads(q, c.n_heads),
            self.split_heads(k, c.n_kv_heads),
            self.split_heads(v, c.n_kv_heads),
        )

    def feed_forward(self, w: dict, h: np.ndarray) -> np.ndarray:
        gate, up = stacked_linears(w, GATE_UP, "ffn_gate_up", h)
        return linear(w["ffn_down"], silu(gate) * up)
