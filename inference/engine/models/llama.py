"""Llama (SmolLM2 and friends): pre-norm blocks, GQA attention, SwiGLU, adjacent-pair RoPE."""

from __future__ import annotations

import numpy as np

from ..fused.fused import LayerWeights
from ..gguf_file import GGUFFile
from ..kv_cache import KVCache
from .base import DecoderModel, layer_slots, linear, stack_linears, stacked_linears
from .config import ModelConfig
from .layers import ROPE_NORM, rms_norm, silu

QKV = ("attn_q", "attn_k", "attn_v")
GATE_UP = ("ffn_gate", "ffn_up")


class LlamaModel(DecoderModel):
    rope_style = ROPE_NORM

    def __init__(self, f: GGUFFile, config: ModelConfig | None = None):
        super().__init__(f, config or ModelConfig.from_gguf(f))
        self.layers = [self.load_layer(i) for i in range(self.config.n_layers)]
        self.fused = self.build_fused()

    def step_layers(self) -> list[LayerWeights] | None:
        layers = []
        for w in self.layers:
            linears, biases = layer_slots(w)
            norms = (w["attn_norm"], None, w["ffn_norm"], None)
            layers.append(LayerWeights(linears, biases, norms, self.qk_norms(w)))
        return layers

    def qk_norms(self, w: dict) -> tuple[np.ndarray, np.ndarray] | None:
        return None

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
