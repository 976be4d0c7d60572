"""Gemma 3: scaled embeddings, q/k norms, pre and post norms around both sublayers, GeGLU,
and interleaved sliding-window (local) and global attention layers with their own RoPE bases.
"""

from __future__ import annotations

import numpy as np

from ..fused.fused import LayerWeights
from ..fused.rowops import gelu_tanh_f16
from ..fused.step_kernels import GELU, POST_NORMS, QK_NORM
from ..gguf_file import GGUFFile
from ..kv_cache import KVCache
from .base import DecoderModel, layer_slots, linear, stack_linears, stacked_linears
from .config import ModelConfig
from .layers import ROPE_NEOX, rms_norm

GLOBAL_EVERY = 6  # layers 5, 11, 17, ... attend globally; the rest use the sliding window
LOCAL_ROPE_BASE = 10000.0  # the architecture's value when the GGUF has no rope.freq_base_swa

NORMS = ("attn_norm", "attn_q_norm", "attn_k_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")
MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
QKV = ("attn_q", "attn_k", "attn_v")
GATE_UP = ("ffn_gate", "ffn_up")


class Gemma3Model(DecoderModel):
    rope_style = ROPE_NEOX
    step_flags = QK_NORM | POST_NORMS | GELU

    def __init__(self, f: GGUFFile):
        config = ModelConfig.from_gguf(
            f,
            sliding_window=int(f.arch_value("attention.sliding_window", 0)),
            rope_base_local=float(f.arch_value("rope.freq_base_swa", LOCAL_ROPE_BASE)),
        )
        super().__init__(f, config)
        self.embed_scale = np.float32(np.sqrt(config.n_embd))
        self.layers = [self.load_layer(i) for i in range(config.n_layers)]
        self.fused = self.build_fused()

    def load_layer(self, i: int) -> dict:
        layer = {name: self.matrix(f"blk.{i}.{name}.weight") for name in MATRICES}
        layer.update({name: self.vector(f"blk.{i}.{name}.weight") for name in NORMS})
        stack_linears(layer, QKV, "attn_qkv")
        stack_linears(layer, GATE_UP, "ffn_gate_up")
        return layer

    def rope_bases(self) -> tuple[float, ...]:
        return (self.config.rope_base, self.config.rope_base_local)

    def step_layers(self) -> list[LayerWeights]:
        layers = []
        for i, w in enumerate(self.layers):
            linears, biases = layer_slots(w)
            norms = tuple(w[n] for n in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"))
            local = self.is_local(i)
            window = self.config.sliding_window if local else 0
            qk = (w["attn_q_norm"], w["attn_k_norm"])
            layers.append(LayerWeights(linears, biases, norms, qk, window, rope_table=int(local)))
        return layers

    def is_local(self, layer: int) -> bool:
        return self.config.sliding_window > 0 and (layer + 1) % GLOBAL_EVERY != 0

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        return super().embed(tokens) * self.embed_scale  # (n, n_embd)

    def block(self, layer: int, x: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        w, eps = self.layers[layer], self.config.norm_eps
        h = self.self_attention(layer, w, rms_norm(x, w["attn_norm"], eps), cache, start)
        x = x + rms_norm(h, w["post_attention_norm"], eps)
        h = rms_norm(x, w["ffn_norm"], eps)
        gate, up = stacked_linears(w, GATE_UP, "ffn_gate_up", h)
        h = linear(w["ffn_down"], gelu_tanh_f16(gate) * up)
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
