"""Inkling's hyperparameters beyond the standard ones, read from the ``inkling.*`` keys."""

from __future__ import annotations

from dataclasses import dataclass

from ..gguf_file import GGUFError, GGUFFile
from .config import ModelConfig

SIGMOID_GATING = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID: the only one Inkling ships


@dataclass(frozen=True)
class InklingShape:
    """Per-layer geometry and the family's own constants."""

    kv_heads: tuple[int, ...]  # per layer
    local: tuple[bool, ...]  # per layer: a sliding-window layer
    head_dim: int
    window: int  # a local layer sees keys with p_q - p_k < window
    d_rel: int
    rel_extent: int  # rel-bias band on global layers
    rel_extent_swa: int  # on local layers
    taps: int  # short-conv kernel size K
    dense_layers: int  # leading layers with a dense FFN; the rest are MoE
    n_experts: int
    n_experts_used: int
    n_ff_expert: int
    n_shared: int
    route_scale: float
    logit_scale: float  # 1 / logit_scale_denom
    log_n_floor: int  # 0: no log-N scaling
    log_alpha: float
    unpadded_vocab: int  # 0: no padding

    def extent(self, layer: int) -> int:
        return self.rel_extent_swa if self.local[layer] else self.rel_extent


def per_layer(f: GGUFFile, key: str, n_layers: int, kind: type) -> tuple:
    """A per-layer array key (or one scalar for every layer) as a tuple of ``kind``."""
    value = f.arch_value(key)
    if value is None:
        raise GGUFError(f"{f.path}: required metadata key {f.architecture}.{key} is missing")
    values = (
        list(value) if isinstance(value, (list, tuple)) or hasattr(value, "tolist") else [value] * n_layers
    )
    if len(values) != n_layers:
        raise GGUFError(f"{f.path}: {f.architecture}.{key} has {len(values)} entries for {n_layers} layers")
    return tuple(kind(v) for v in values)


def inkling_shape(f: GGUFFile) -> InklingShape:
    """Read and check the shape; GGUFError names a missing or impossible value."""

    def need(key: str):
        value = f.arch_value(key)
        if value is None:
            raise GGUFError(f"{f.path}: required metadata key inkling.{key} is missing")
        return value

    n_layers, n_heads = int(need("block_count")), int(need("attention.head_count"))
    kv_heads = per_layer(f, "attention.head_count_kv", n_layers, int)
    if any(h <= 0 or n_heads % h for h in kv_heads):
        raise GGUFError(f"{f.path}: kv head counts {kv_heads} do not divide {n_heads} heads")
    gating = int(f.arch_value("expert_gating_func", SIGMOID_GATING))
    if gating != SIGMOID_GATING:
        raise GGUFError(f"{f.path}: inkling.expert_gating_func {gating} is not supported (only sigmoid, 2)")
    denom = float(need("logit_scale_denom"))
    if denom == 0:
        raise GGUFError(f"{f.path}: inkling.logit_scale_denom is 0")
    taps = int(need("shortconv_kernel"))
    if taps < 1:
        raise GGUFError(f"{f.path}: inkling.shortconv_kernel must be at least 1")
    return InklingShape(
        kv_heads=kv_heads,
        local=per_layer(f, "attention.sliding_window_pattern", n_layers, bool),
        head_dim=int(need("attention.key_length")),
        window=int(need("attention.sliding_window")),
        d_rel=int(need("d_rel")),
        rel_extent=int(need("rel_extent")),
        rel_extent_swa=int(need("rel_extent_swa")),
        taps=taps,
        dense_layers=int(f.arch_value("dense_block_count", 0)),
        n_experts=int(need("expert_count")),
        n_experts_used=int(need("expert_used_count")),
        n_ff_expert=int(need("expert_feed_forward_length")),
        n_shared=int(need("expert_shared_count")),
        route_scale=float(f.arch_value("expert_weights_scale", 1.0)),
        logit_scale=1.0 / denom,
        log_n_floor=int(f.arch_value("log_scaling_n_floor", 0)),
        log_alpha=float(f.arch_value("log_scaling_alpha", 0.0)),
        unpadded_vocab=int(f.arch_value("unpadded_vocab_size", 0)),
    )


def inkling_config(f: GGUFFile, s: InklingShape) -> ModelConfig:
    """The model's ModelConfig: the kv geometry holds the layer with the most kv heads (every
    layer uses the first ``kv_heads[layer]`` of a row); no RoPE."""
    return ModelConfig(
        architecture=f.architecture,
        n_layers=len(s.kv_heads),
        n_embd=int(f.require("inkling.embedding_length")),
        n_ff=int(f.arch_value("feed_forward_length", 0)),
        n_heads=int(f.require("inkling.attention.head_count")),
        n_kv_heads=max(s.kv_heads),
        head_dim_k=s.head_dim,
        head_dim_v=s.head_dim,
        n_rot=0,
        rope_base=0.0,
        norm_eps=float(f.require("inkling.attention.layer_norm_rms_epsilon")),
        n_ctx_train=int(f.arch_value("context_length", 2048)),
        vocab_size=len(f.require("tokenizer.ggml.tokens")),
        n_experts=s.n_experts,
        n_experts_used=s.n_experts_used,
        n_ff_expert=s.n_ff_expert,
        sliding_window=s.window,
    )
