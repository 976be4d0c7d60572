"""Gemma 4: Gemma 3's sandwich-normed block with a per-layer attention geometry, a weightless
norm on v, attention unscaled (scale 1), proportional RoPE on global layers, shared-kv layers,
an optional per-layer output scale, a final logit softcap and, in the MoE variant, routed
GeGLU experts beside the dense MLP (gemma4_moe.py).

Layer code is numpy (``block``): the fused forward has no stage for unequal layer shapes, a v
norm or experts. Each step is computed per row in a fixed order, so a row's logits do not
depend on which rows share its forward (tests/inference/engine/test_invariance.py).
Per-layer embeddings (the E2B/E4B checkpoints' ``per_layer_token_embd``) are gemma4_ple.py's.
"""

from __future__ import annotations

import numba
import numpy as np

from ..fused.kernels import attend_rows
from ..fused.rowops import gelu_tanh_f16
from ..gguf_file import GGUFError, GGUFFile
from ..kv_cache import KVCache
from .base import DecoderModel, linear
from .gemma4_moe import ExpertFFN
from .gemma4_ple import PerLayerInject, PerLayerInputs
from .gemma4_shapes import LayerShape, gemma4_config, layer_shapes
from .layers import ROPE_NEOX, apply_rope, rms_norm

NORMS = ("attn_norm", "attn_q_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")
MOE_NORMS = ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2")
ONES = np.float32(1.0)


@numba.njit(cache=True)
def rope_table_scaled(positions, n_rot, base, factors, cos, sin):
    """cos, sin (n, n_rot/2) as ggml's rope cache computes them with frequency factors: theta
    starts at the position, is multiplied by base ** (-2 / n_rot) pair after pair in float32,
    and each pair's angle is theta / factor (proportional RoPE: a huge factor stops a pair)."""
    theta_scale = np.float32(base) ** (np.float32(-2.0) / np.float32(n_rot))
    for i in range(positions.shape[0]):
        theta = np.float32(positions[i])
        for j in range(n_rot // 2):
            angle = theta / factors[j]
            cos[i, j] = np.cos(angle)
            sin[i, j] = np.sin(angle)
            theta = theta * theta_scale


@numba.njit(cache=True)
def softcap_rows(x, cap):
    """x = tanh(x / cap) * cap in place, per element in float32 (ggml scale, tanh, scale)."""
    inverse = np.float32(1.0) / np.float32(cap)
    flat = x.reshape(-1)
    for i in range(flat.shape[0]):
        flat[i] = np.tanh(flat[i] * inverse) * np.float32(cap)


class Gemma4Model(DecoderModel):
    rope_style = ROPE_NEOX

    def __init__(self, f: GGUFFile):
        n_layers = int(f.require(f"{f.architecture}.block_count"))
        self.shapes: list[LayerShape] = layer_shapes(f, n_layers)
        config = gemma4_config(
            f,
            self.shapes,
            n_experts=int(f.arch_value("expert_count", 0)),
            n_experts_used=int(f.arch_value("expert_used_count", 0)),
            n_ff_expert=int(f.arch_value("expert_feed_forward_length", 0)),
        )
        super().__init__(f, config)
        self.embed_scale = np.float32(np.sqrt(config.n_embd))
        self.softcap = float(f.arch_value("final_logit_softcapping", 0.0))
        self.rope_factors = self.optional_vector("rope_freqs.weight")  # global layers' frequency factors
        global_rot = max((s.n_rot for s in self.shapes if not s.local), default=0)
        if self.rope_factors is not None and len(self.rope_factors) < global_rot // 2:
            n_factors = len(self.rope_factors)
            raise GGUFError(
                f"{f.path}: rope_freqs has {n_factors} entries, global layers rotate {global_rot}"
            )
        self.ple_width = int(f.arch_value("embedding_length_per_layer_input", 0))
        if self.ple_width < 0 or (self.ple_width == 0 and f.has_tensor("per_layer_token_embd.weight")):
            raise GGUFError(f"{f.path}: per_layer_token_embd needs embedding_length_per_layer_input > 0")
        self.per_layer_inputs = (
            PerLayerInputs(f, n_layers, config.n_embd, self.ple_width, config.vocab_size)
            if self.ple_width
            else None
        )
        self.layers = [self.load_layer(i) for i in range(n_layers)]
        self.fused = None  # see the module docstring

    def load_layer(self, i: int) -> dict:
        p, shape = f"blk.{i}.", self.shapes[i]
        layer = {name: self.matrix(f"{p}{name}.weight") for name in ("attn_q", "attn_output")}
        layer.update({name: self.vector(f"{p}{name}.weight") for name in NORMS})
        if shape.owns_kv:
            layer["attn_k"] = self.matrix(p + "attn_k.weight")
            layer["attn_k_norm"] = self.vector(p + "attn_k_norm.weight")
            if self.file.has_tensor(p + "attn_v.weight"):  # absent: v is k's projection
                layer["attn_v"] = self.matrix(p + "attn_v.weight")
        for name in ("ffn_gate", "ffn_up", "ffn_down"):
            layer[name] = self.matrix(f"{p}{name}.weight")
        if self.file.has_tensor(p + "ffn_gate_inp.weight"):
            layer["experts"] = ExpertFFN(self.file, i, self.config.n_experts_used, self.config.n_ff_expert)
            layer.update({name: self.vector(f"{p}{name}.weight") for name in MOE_NORMS})
        if self.ple_width:
            layer["ple"] = PerLayerInject(self.file, i, self.config.n_embd, self.ple_width)
        out_scale = self.optional_vector(p + "layer_output_scale.weight")
        layer["out_scale"] = None if out_scale is None else np.float32(out_scale.reshape(-1)[0])
        return layer

    # -- forward ---------------------------------------------------------------------------
    def embed(self, tokens: np.ndarray) -> np.ndarray:
        return super().embed(tokens) * self.embed_scale  # (n, n_embd)

    def block(
        self, layer: int, x: np.ndarray, cache: KVCache, start: int, per_layer_input: np.ndarray | None = None
    ) -> np.ndarray:
        """One layer over x (n, n_embd); per_layer_input (n, width): its per-layer embedding rows."""
        w, eps = self.layers[layer], self.config.norm_eps
        h = self.self_attention(layer, w, rms_norm(x, w["attn_norm"], eps), cache, start)
        x = rms_norm(h, w["post_attention_norm"], eps) + x
        x = rms_norm(self.feed_forward(w, x), w["post_ffw_norm"], eps) + x
        if per_layer_input is not None:  # after the FFN residual, before the output scale
            x = w["ple"](x, per_layer_input, eps)
        return x if w["out_scale"] is None else x * w["out_scale"]

    def _residual_layers(self, tokens: list[int], cache: KVCache) -> np.ndarray:
        """The base class's layer loop, plus each layer's per-layer embedding rows when the
        file has them (they depend on the tokens and their scaled embedding only)."""
        if self.per_layer_inputs is None:
            return super()._residual_layers(tokens, cache)
        start, ids = cache.n_positions, np.asarray(tokens, dtype=np.int64)
        x = self.embed(ids)  # (n, n_embd)
        inputs = self.per_layer_inputs(ids, x, self.config.norm_eps)  # (n_layers, n, width)
        for layer in range(self.config.n_layers):
            x = self.block(layer, x, cache, start, inputs[layer])
        cache.commit(tokens)
        return x

    def feed_forward(self, w: dict, x: np.ndarray) -> np.ndarray:
        """The dense GeGLU MLP on the residual x (n, n_embd); in a MoE layer, plus the experts."""
        eps = self.config.norm_eps
        h = rms_norm(x, w["ffn_norm"], eps)
        mlp = linear(w["ffn_down"], gelu_tanh_f16(linear(w["ffn_gate"], h)) * linear(w["ffn_up"], h))
        if "experts" not in w:
            return mlp
        moe = w["experts"](x, rms_norm(x, w["pre_ffw_norm_2"], eps), eps)
        return rms_norm(mlp, w["post_ffw_norm_1"], eps) + rms_norm(moe, w["post_ffw_norm_2"], eps)

    def rope_table(self, shape: LayerShape, start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin (n, n_rot/2) of a layer at positions start..start+n (frequency factors on
        global layers, when the file has them)."""
        half = shape.n_rot // 2
        factors = self.rope_factors if not shape.local and self.rope_factors is not None else None
        factors = np.ones(half, np.float32) if factors is None else np.asarray(factors[:half], np.float32)
        cos = np.empty((n, half), np.float32)  # (n, n_rot/2)
        sin = np.empty_like(cos)  # (n, n_rot/2)
        positions = np.arange(start, start + n, dtype=np.int64)
        rope_table_scaled(positions, shape.n_rot, shape.rope_base, factors, cos, sin)
        return cos, sin

    def self_attention(self, layer: int, w: dict, h: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        c, s, n = self.config, self.shapes[layer], h.shape[0]
        q, keys, values = self.project_qkv(layer, w, h, cache, start)
        out = np.empty((n, c.n_heads, s.head_dim), np.float32)  # (n, heads, hd)
        window = c.sliding_window if s.local else 0
        attend_rows(q, keys.view(np.uint16), values.view(np.uint16), start, window, np.float32(1.0), out)
        return linear(w["attn_output"], out.reshape(n, -1))

    def project_qkv(
        self, layer: int, w: dict, h: np.ndarray, cache: KVCache, start: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rotated queries (n, heads, hd) of the normed input h at positions start..start+n,
        and the layer's cache rows (kvh, ctx, hd) as views, this run's k and v rows written into
        them (a shared-kv layer writes none; nothing is committed)."""
        c, s, n = self.config, self.shapes[layer], h.shape[0]
        cos, sin = self.rope_table(s, start, n)
        q = linear(w["attn_q"], h).reshape(n, c.n_heads, s.head_dim)
        q = apply_rope(rms_norm(q, w["attn_q_norm"], c.norm_eps), cos, sin, ROPE_NEOX)  # (n, heads, hd)
        kv_layer = layer if s.owns_kv else s.kv_layer
        owner = self.shapes[kv_layer]
        keys = cache.k[kv_layer, : owner.n_kv_heads, :, : owner.head_dim]  # (kvh, ctx, hd) a view
        values = cache.v[kv_layer, : owner.n_kv_heads, :, : owner.head_dim]  # (kvh, ctx, hd) a view
        if s.owns_kv:
            k = linear(w["attn_k"], h)  # (n, kvh * hd)
            v = linear(w["attn_v"], h) if "attn_v" in w else k
            k = rms_norm(k.reshape(n, s.n_kv_heads, s.head_dim), w["attn_k_norm"], c.norm_eps)
            v = rms_norm(v.reshape(n, s.n_kv_heads, s.head_dim), ONES, c.norm_eps)
            keys[:, start : start + n] = apply_rope(k, cos, sin, ROPE_NEOX).transpose(1, 0, 2)
            values[:, start : start + n] = v.transpose(1, 0, 2)
        return q, keys, values

    def forward_layers(self, tokens: list[int], cache: KVCache, all_logits: bool = False) -> np.ndarray:
        logits = super().forward_layers(tokens, cache, all_logits)  # (vocab,) or (n, vocab)
        if self.softcap > 0:
            logits = np.ascontiguousarray(logits, np.float32)
            softcap_rows(logits, self.softcap)
        return logits
