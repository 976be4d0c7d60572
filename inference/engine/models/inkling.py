"""Inkling (GGUF ``inkling``, thinkingmachines/Inkling): hybrid local/global attention with a
content-dependent relative-position bias instead of RoPE, short causal convolutions on four
sites per layer, a sigmoid-routed mixture of experts with shared experts as softmax sinks
(inkling_ffn.py), log-N attention scaling on global layers and muP logit scaling.

Definitions follow the reference (llama.cpp PR #25731 as ported in fucina's
``src/llm/inkling/model.zig``). One layer, for rows x at positions p:

- ``h = rms_norm(x, attn_norm)``; q, k, v and the rel-bias query r are projections of h;
- k and v (flat, before the head split) go through their short convolutions (with residual);
- the rel-bias logits ``rel[p, head, d] = r[p, head] . attn_rel_proj[:, d]`` for distances
  ``d < extent`` (``rel_extent``, or ``rel_extent_swa`` on local layers);
- q and k heads are RMS-normed with weights; on global layers with ``log_scaling_n_floor``,
  q and rel are multiplied by ``tau = 1 + alpha * ln(max((p + 1) / floor, 1))``;
- scores ``q . k / head_dim + rel[d]`` with ``d = p_q - p_k`` (no RoPE anywhere), causal, and on
  local layers only keys with ``d < sliding_window``; softmax; the weighted sum of v;
- ``x += short_conv(attn_output(o))``; then ``x += short_conv(gscale * ffn(rms_norm(x, ffn_norm)))``.

The embedding rows are RMS-normed (``token_embd_norm``); the final norm's output is scaled by
``1 / logit_scale_denom`` before the head; ids from ``unpadded_vocab_size`` on get -inf.

numpy layers only (``block``; no fused forward): every step reduces one row in a fixed order,
so a row's logits do not depend on how many rows share its forward.
"""

from __future__ import annotations

import numpy as np

from ..gguf_file import GGUFError, GGUFFile
from ..kv_cache import KVCache
from .base import DecoderModel, linear, stack_linears, stacked_linears
from .inkling_ffn import InklingMoE, swiglu
from .inkling_shapes import InklingShape, inkling_config, inkling_shape
from .inkling_state import SITES, ConvGeometry, InklingCache, short_conv
from .layers import rms_norm

QKVR = ("attn_q", "attn_k", "attn_v", "attn_r")


class InklingModel(DecoderModel):
    def __init__(self, f: GGUFFile):
        self.shape: InklingShape = inkling_shape(f)
        s = self.shape
        config = inkling_config(f, s)
        super().__init__(f, config)
        self.embd_norm = self.vector("token_embd_norm.weight")
        self.layers = [self.load_layer(i) for i in range(config.n_layers)]
        self.fused = None  # see the module docstring

    def load_layer(self, i: int) -> dict:
        p, s = f"blk.{i}.", self.shape
        layer = {name: self.matrix(f"{p}{name}.weight") for name in (*QKVR, "attn_output")}
        stack_linears(layer, QKVR, "attn_qkvr")
        for name in ("attn_norm", "attn_q_norm", "attn_k_norm", "ffn_norm"):
            layer[name] = self.vector(f"{p}{name}.weight")
        extent = s.extent(i)
        rel = self.vector(p + "attn_rel_proj.weight")
        if rel.shape != (s.d_rel, extent):
            raise GGUFError(
                f"{self.file.path}: {p}attn_rel_proj is {rel.shape}, expected {(s.d_rel, extent)}"
            )
        layer["rel_proj"] = rel  # (d_rel, extent)
        kv_width = s.kv_heads[i] * s.head_dim
        for site, width in zip(SITES, (kv_width, kv_width, self.config.n_embd, self.config.n_embd)):
            kernel = self.vector(f"{p}shortconv_{site}.weight")  # (width, K)
            if kernel.shape != (width, s.taps):
                raise GGUFError(
                    f"{self.file.path}: {p}shortconv_{site} is {kernel.shape}, expected {(width, s.taps)}"
                )
            layer["conv_" + site] = kernel
        layer["gscale"] = np.float32(self.vector(p + "ffn_gscale.weight").reshape(-1)[0])
        if i < s.dense_layers:
            for name in ("ffn_gate", "ffn_up", "ffn_down"):
                layer[name] = self.matrix(f"{p}{name}.weight")
        else:
            layer["moe"] = InklingMoE(self.file, i, s.n_experts_used, s.n_shared, s.route_scale)
        return layer

    # -- cache -----------------------------------------------------------------------------
    def new_cache(self, n_ctx: int) -> KVCache:
        s = self.shape
        kv_widths = tuple(h * s.head_dim for h in s.kv_heads)
        return InklingCache(
            self.config.kv_geometry, n_ctx, ConvGeometry(s.taps, kv_widths, self.config.n_embd)
        )

    # -- forward ---------------------------------------------------------------------------
    def embed(self, tokens: np.ndarray) -> np.ndarray:
        return rms_norm(super().embed(tokens), self.embd_norm, self.config.norm_eps)  # (n, n_embd)

    def _residual_layers(self, tokens: list[int], cache: KVCache) -> np.ndarray:
        if not isinstance(cache, InklingCache):
            raise TypeError("inkling needs its own cache (InklingModel.new_cache)")
        start = cache.n_positions
        cache.check_conv(start)
        cache.conv_at = None  # a forward that fails halfway leaves the state unusable, and says so
        x = super()._residual_layers(tokens, cache)  # (n, n_embd)
        cache.conv_at = start + len(tokens)
        return x

    def forward_layers(self, tokens: list[int], cache: KVCache, all_logits: bool = False) -> np.ndarray:
        """The head as the reference runs it: the final norm times the muP logit scale, then
        the output matrix; padded vocabulary ids get -inf."""
        x = self._residual_layers(tokens, cache)  # (n, n_embd)
        if not all_logits:
            x = x[-1:]
        h = rms_norm(x, self.output_norm, self.config.norm_eps) * np.float32(self.shape.logit_scale)
        logits = linear(self.output, h)  # (n, vocab)
        if 0 < self.shape.unpadded_vocab < logits.shape[-1]:
            logits[:, self.shape.unpadded_vocab :] = -np.inf
        return logits if all_logits else logits[0]

    def block(self, layer: int, x: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        w, eps = self.layers[layer], self.config.norm_eps
        o = self.self_attention(layer, w, rms_norm(x, w["attn_norm"], eps), cache, start)  # (n, n_embd)
        x = x + short_conv(o, w["conv_attn"], cache.state(layer, "attn"))
        h = rms_norm(x, w["ffn_norm"], eps)  # (n, n_embd)
        if "moe" in w:
            f = w["moe"](h, w["gscale"])  # (n, n_embd)
        else:
            f = swiglu(w["ffn_gate"], w["ffn_up"], w["ffn_down"], h) * w["gscale"]  # (n, n_embd)
        return x + short_conv(f, w["conv_mlp"], cache.state(layer, "mlp"))

    def log_n_tau(self, layer: int, start: int, n: int) -> np.ndarray | None:
        """Global layers' log-N factor per row (n, 1, 1), None where it does not apply."""
        s = self.shape
        if s.local[layer] or s.log_n_floor <= 0:
            return None
        eff = np.arange(start + 1, start + n + 1, dtype=np.float32) / np.float32(s.log_n_floor)  # (n,)
        tau = np.float32(1.0) + np.float32(s.log_alpha) * np.log(np.maximum(eff, np.float32(1.0)))  # (n,)
        return tau.reshape(n, 1, 1)

    def self_attention(self, layer: int, w: dict, h: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        c, s, n = self.config, self.shape, h.shape[0]
        kvh, hd = s.kv_heads[layer], s.head_dim
        q, k, v, r = stacked_linears(w, QKVR, "attn_qkvr", h)
        k = short_conv(k, w["conv_k"], cache.state(layer, "k"))  # (n, kvh * hd)
        v = short_conv(v, w["conv_v"], cache.state(layer, "v"))  # (n, kvh * hd)
        rel = np.einsum("nhd,de->nhe", r.reshape(n, c.n_heads, s.d_rel), w["rel_proj"])  # (n, heads, extent)
        q = rms_norm(q.reshape(n, c.n_heads, hd), w["attn_q_norm"], c.norm_eps)  # (n, heads, hd)
        k = rms_norm(k.reshape(n, kvh, hd), w["attn_k_norm"], c.norm_eps)  # (n, kvh, hd)
        tau = self.log_n_tau(layer, start, n)
        if tau is not None:
            q, rel = q * tau, rel * tau
        keys = cache.k[layer, :kvh]  # (kvh, ctx, hd) a view
        values = cache.v[layer, :kvh]  # (kvh, ctx, hd) a view
        keys[:, start : start + n] = k.transpose(1, 0, 2)
        values[:, start : start + n] = v.reshape(n, kvh, hd).transpose(1, 0, 2)
        window = s.window if s.local[layer] else 0
        out = np.empty((n, c.n_heads, hd), np.float32)  # (n, heads, hd)
        for i in range(n):
            out[i] = attend_one(q[i], rel[i], keys, values, start + i, window, np.float32(1.0 / hd))
        return linear(w["attn_output"], out.reshape(n, -1))


def attend_one(
    q: np.ndarray, rel: np.ndarray, keys: np.ndarray, values: np.ndarray, pos: int, window: int, scale
) -> np.ndarray:
    """One query row's attention: q (heads, hd), rel (heads, extent), keys and values
    (kvh, ctx, hd) f16 with rows up to ``pos`` written; returns (heads, hd)."""
    heads, kvh = q.shape[0], keys.shape[0]
    first = max(0, pos + 1 - window) if window else 0
    k = keys[:, first : pos + 1].astype(np.float32)  # (kvh, t, hd)
    v = values[:, first : pos + 1].astype(np.float32)  # (kvh, t, hd)
    group = heads // kvh
    kv_of = np.arange(heads) // group  # (heads,)
    scores = np.einsum("hd,htd->ht", q, k[kv_of]) * scale  # (heads, t)
    distance = pos - np.arange(first, pos + 1)  # (t,)
    near = distance < rel.shape[1]
    scores[:, near] += rel[:, distance[near]]
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    scores /= scores.sum(axis=-1, keepdims=True)
    return np.einsum("ht,htd->hd", scores, v[kv_of])  # (heads, hd)
