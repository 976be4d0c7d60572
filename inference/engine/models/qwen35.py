"""Qwen3.5 (``qwen35``): a hybrid of gated-DeltaNet linear-attention layers and gated
full-attention layers (by default every fourth), as llama.cpp's ``qwen35`` graph builds it.

Every layer: x += mixer(rms_norm(x)); x += SwiGLU(rms_norm(x, post_attention_norm)).

- Full attention: ``attn_q`` yields per head a query and an output gate side by side; q and k
  are RMS-normed per head, rotated by interleaved M-RoPE (text positions on the t, h and w
  sections, position 0 on the e section) over the first ``rope.dimension_count`` dimensions,
  NeoX halves; the attention output is multiplied by sigmoid(gate) before ``attn_output``.
- Linear attention (deltanet.py): ``attn_qkv`` -> causal depthwise conv -> SiLU -> q, k
  (l2-normed), v; beta = sigmoid(``ssm_beta`` x); g = softplus(``ssm_alpha`` x + dt) * ``ssm_a``;
  the delta rule; an RMS norm per head gated by SiLU(``attn_gate`` x); ``ssm_out``.

Layer code is numpy but for the delta rule, a numba kernel (fused/delta_rule.py, bitwise its
numpy reference). The recurrence runs token after token in prefill and decode alike, so a
row's result never depends on which rows share its forward. The conversation's recurrent state lives in its
:class:`~.deltanet.HybridCache`, which cannot be cut back to a token prefix (no KV reuse).
"""

from __future__ import annotations

import numpy as np

from ..fused.kernels import attend_rows
from ..gguf_file import GGUFError, GGUFFile
from ..kv_cache import KVCache, KVGeometry
from .base import DecoderModel, linear
from .config import ModelConfig
from .deltanet import DeltaNetShape, HybridCache, causal_conv, delta_rule, l2_norm, sigmoid, softplus
from .layers import ROPE_NEOX, apply_rope, rms_norm, rope_angles, silu

ATTENTION_TENSORS = ("attn_q", "attn_k", "attn_v", "attn_output")
LINEAR_TENSORS = ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha", "ssm_out")


def recurrent_layers(f: GGUFFile, n_layers: int) -> list[bool]:
    """Which layers are linear attention: ``attention.recurrent_layers`` when the file has it,
    else every layer but each ``full_attention_interval``-th (default 4), as llama.cpp reads it."""
    flags = f.arch_value("attention.recurrent_layers")
    if flags is not None:
        return [bool(v) for v in list(flags)[:n_layers]]
    interval = int(f.arch_value("full_attention_interval", 4))
    return [(i + 1) % interval != 0 for i in range(n_layers)]


def deltanet_shape(f: GGUFFile) -> DeltaNetShape:
    def need(key: str) -> int:
        value = f.arch_value(key)
        if value is None:
            raise GGUFError(f"{f.path}: required metadata key {f.architecture}.{key} is missing")
        return int(value)

    n_v_heads = need("ssm.time_step_rank")
    shape = DeltaNetShape(
        n_k_heads=need("ssm.group_count"),
        n_v_heads=n_v_heads,
        head_k=need("ssm.state_size"),
        head_v=need("ssm.inner_size") // n_v_heads,
        d_conv=need("ssm.conv_kernel"),
    )
    if shape.n_v_heads % shape.n_k_heads or shape.head_k != shape.head_v:
        raise GGUFError(f"{f.path}: unsupported DeltaNet geometry {shape}")
    return shape


def imrope_static_pairs(sections: list[int], n_pairs: int) -> np.ndarray:
    """The rotary pairs that interleaved M-RoPE turns by the e position (always 0 for text,
    so they stay unrotated): ggml's sector rule (``ggml_mrope_cache_init``, imrope)."""
    s0, s1, s2, _ = (list(sections) + [0, 0, 0, 0])[:4]
    total = sum(sections[:4])
    static = np.zeros(n_pairs, bool)  # (n_rot/2,)
    for pair in range(n_pairs):
        sector = pair % total
        by_position = (
            (sector % 3 == 1 and sector < 3 * s1)
            or (sector % 3 == 2 and sector < 3 * s2)
            or (sector % 3 == 0 and sector < 3 * s0)
        )
        static[pair] = not by_position
    return static


class Qwen35Model(DecoderModel):
    rope_style = ROPE_NEOX

    def __init__(self, f: GGUFFile):
        # The last ``nextn_predict_layers`` blocks are multi-token-prediction heads, not run here.
        trunk = int(f.require(f"{f.architecture}.block_count")) - int(f.arch_value("nextn_predict_layers", 0))
        super().__init__(f, ModelConfig.from_gguf(f, n_layers=trunk, **self.config_overrides(f)))
        c = self.config
        self.recurrent = recurrent_layers(f, c.n_layers)
        self.shape = deltanet_shape(f)
        self.kv_slot = {}  # layer -> its rows in the cache (full-attention layers only)
        for i, is_linear in enumerate(self.recurrent):
            if not is_linear:
                self.kv_slot[i] = len(self.kv_slot)
        self.state_slot = {i: j for j, i in enumerate(i for i, r in enumerate(self.recurrent) if r)}
        sections = [int(v) for v in list(f.arch_value("rope.dimension_sections", [c.n_rot // 2, 0, 0, 0]))]
        self.static_pairs = imrope_static_pairs(sections, c.n_rot // 2)
        self.layers = [self.load_layer(i) for i in range(c.n_layers)]
        self.fused = None  # see the module docstring

    def config_overrides(self, f: GGUFFile) -> dict:
        return {}

    def new_cache(self, n_ctx: int) -> KVCache:
        c = self.config
        geometry = KVGeometry(len(self.kv_slot), c.n_kv_heads, c.head_dim_k, c.head_dim_v)
        return HybridCache(geometry, n_ctx, self.shape, len(self.state_slot))

    # -- weights -----------------------------------------------------------------------------
    def load_layer(self, i: int) -> dict:
        p = f"blk.{i}."
        layer = {name: self.vector(f"{p}{name}.weight") for name in ("attn_norm", "post_attention_norm")}
        if self.recurrent[i]:
            layer.update({name: self.matrix(f"{p}{name}.weight") for name in LINEAR_TENSORS})
            conv = self.vector(p + "ssm_conv1d.weight")  # (conv_dim, d_conv)
            layer["ssm_conv1d"] = np.ascontiguousarray(conv.reshape(self.shape.conv_dim, self.shape.d_conv))
            layer["ssm_dt"] = self.vector(p + "ssm_dt.bias")  # (Hv,)
            layer["ssm_a"] = self.vector(p + "ssm_a")  # (Hv,) = -exp(A_log)
            layer["ssm_norm"] = self.vector(p + "ssm_norm.weight")  # (head_v,)
        else:
            layer.update({name: self.matrix(f"{p}{name}.weight") for name in ATTENTION_TENSORS})
            layer["attn_q_norm"] = self.vector(p + "attn_q_norm.weight")
            layer["attn_k_norm"] = self.vector(p + "attn_k_norm.weight")
        layer.update(self.load_ffn(i))
        return layer

    def load_ffn(self, i: int) -> dict:
        return {name: self.matrix(f"blk.{i}.{name}.weight") for name in ("ffn_gate", "ffn_up", "ffn_down")}

    # -- forward ---------------------------------------------------------------------------
    def block(self, layer: int, x: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        w, eps = self.layers[layer], self.config.norm_eps
        h = rms_norm(x, w["attn_norm"], eps)  # (n, n_embd)
        if self.recurrent[layer]:
            x = x + self.linear_attention(self.state_slot[layer], w, h, cache)
        else:
            x = x + self.gated_attention(self.kv_slot[layer], w, h, cache, start)
        return x + self.feed_forward(w, rms_norm(x, w["post_attention_norm"], eps))

    def feed_forward(self, w: dict, h: np.ndarray) -> np.ndarray:
        return linear(w["ffn_down"], silu(linear(w["ffn_gate"], h)) * linear(w["ffn_up"], h))

    def rope_table(self, start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin (n, n_rot/2) at positions start..start+n, the e-section pairs unrotated."""
        c = self.config
        cos, sin = rope_angles(np.arange(start, start + n), c.n_rot, c.rope_base)  # (n, n_rot/2)
        cos[:, self.static_pairs] = 1.0
        sin[:, self.static_pairs] = 0.0
        return cos, sin

    def gated_attention(self, slot: int, w: dict, h: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        c, n = self.config, h.shape[0]
        hd = c.head_dim_k
        q_gate = linear(w["attn_q"], h).reshape(n, c.n_heads, 2 * hd)  # (n, heads, 2*hd)
        q = rms_norm(q_gate[:, :, :hd], w["attn_q_norm"], c.norm_eps)  # (n, heads, hd)
        gate = np.ascontiguousarray(q_gate[:, :, hd:]).reshape(n, c.n_heads * hd)  # (n, heads*hd)
        k = rms_norm(self.split_heads(linear(w["attn_k"], h), c.n_kv_heads), w["attn_k_norm"], c.norm_eps)
        v = self.split_heads(linear(w["attn_v"], h), c.n_kv_heads)  # (n, kvh, hd)
        cos, sin = self.rope_table(start, n)
        q, k = apply_rope(q, cos, sin, ROPE_NEOX), apply_rope(k, cos, sin, ROPE_NEOX)
        cache.write(slot, start, k, v)
        out = np.empty((n, c.n_heads, hd), np.float32)  # (n, heads, hd)
        scale = np.float32(1.0 / np.sqrt(np.float32(hd)))
        attend_rows(np.ascontiguousarray(q), cache.k_bits[slot], cache.v_bits[slot], start, 0, scale, out)
        return linear(w["attn_output"], out.reshape(n, -1) * sigmoid(gate))

    def linear_attention(self, slot: int, w: dict, h: np.ndarray, cache: KVCache) -> np.ndarray:
        s, n, eps = self.shape, h.shape[0], self.config.norm_eps
        state = cache.recurrent
        mixed = causal_conv(linear(w["attn_qkv"], h), state.conv[slot], w["ssm_conv1d"])  # (n, conv_dim)
        mixed = silu(mixed)
        q = l2_norm(mixed[:, : s.key_dim].reshape(n, s.n_k_heads, s.head_k), eps)  # (n, Hk, head_k)
        k = l2_norm(mixed[:, s.key_dim : 2 * s.key_dim].reshape(n, s.n_k_heads, s.head_k), eps)
        v = mixed[:, 2 * s.key_dim :].reshape(n, s.n_v_heads, s.head_v)  # (n, Hv, head_v)
        beta = sigmoid(linear(w["ssm_beta"], h))  # (n, Hv)
        g = softplus(linear(w["ssm_alpha"], h) + w["ssm_dt"]) * w["ssm_a"]  # (n, Hv)
        out = delta_rule(q, k, v, g, beta, state.ssm[slot])  # (n, Hv, head_v)
        z = linear(w["attn_gate"], h).reshape(n, s.n_v_heads, s.head_v)  # (n, Hv, head_v)
        gated = rms_norm(out, w["ssm_norm"], eps) * silu(z)  # (n, Hv, head_v)
        return linear(w["ssm_out"], gated.reshape(n, s.value_dim))
