"""The frozen model as float32 dense matrices, dequantized once per model and kept with it.

Training multiplies by each weight and by its transpose (the backward), so the quantized
product kernels of the serving path do not serve; the dequantized copies cost
``4 * parameters`` bytes (SmolLM2-135M: ~0.5 GB) and are built on first use.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from ..models.base import DecoderModel
from ..models.gemma3 import Gemma3Model
from ..models.layers import ROPE_NEOX
from ..models.llama import LlamaModel


class UnsupportedModelError(ValueError):
    """The family has no training forward (e.g. mixture of experts)."""


@dataclass(frozen=True)
class LayerParams:
    """One layer's frozen weights: matrices (rows, cols) float32 as y = x @ W.T + b."""

    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    bq: np.ndarray | None
    bk: np.ndarray | None
    bv: np.ndarray | None
    wo: np.ndarray
    w_gate: np.ndarray
    w_up: np.ndarray
    w_down: np.ndarray
    attn_norm: np.ndarray
    ffn_norm: np.ndarray
    q_norm: np.ndarray | None  # qwen3, gemma3: per-head RMS norms of q and k
    k_norm: np.ndarray | None
    post_attn_norm: np.ndarray | None  # gemma3: norms of each sublayer's output
    post_ffn_norm: np.ndarray | None
    window: int  # sliding-window length (0: global attention)
    rope_base: float


@dataclass(frozen=True)
class TrainingWeights:
    """Everything the training forward needs, shared by every cartridge of one model."""

    layers: tuple[LayerParams, ...]
    head: np.ndarray  # (vocab, n_embd)
    output_norm: np.ndarray
    neox: bool  # RoPE rotates halves (True) or adjacent pairs
    gelu: bool  # GeGLU (gemma3) instead of SwiGLU
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_rot: int
    eps: float

    @property
    def nbytes(self) -> int:
        arrays = [self.head] + [a for p in self.layers for a in vars(p).values() if isinstance(a, np.ndarray)]
        return sum(a.nbytes for a in arrays)


def _split(layer: dict, stacked: str, names: tuple[str, ...]) -> list[np.ndarray]:
    """The dense matrices ``names`` of a layer, unstacked when the loader stacked them."""
    if stacked in layer:
        return np.split(layer[stacked].dequantize(), layer[stacked + "_splits"], axis=0)
    return [layer[name].dequantize() for name in names]


def _biases(layer: dict) -> list[np.ndarray | None]:
    if "attn_qkv_bias" in layer:
        return np.split(layer["attn_qkv_bias"], layer["attn_qkv_splits"])
    return [layer.get(f"{name}_bias") for name in ("attn_q", "attn_k", "attn_v")]


def _layer_params(model: DecoderModel, i: int) -> LayerParams:
    w, c = model.layers[i], model.config
    wq, wk, wv = _split(w, "attn_qkv", ("attn_q", "attn_k", "attn_v"))
    w_gate, w_up = _split(w, "ffn_gate_up", ("ffn_gate", "ffn_up"))
    bq, bk, bv = _biases(w)
    gemma = isinstance(model, Gemma3Model)
    window, base = 0, c.rope_base
    if gemma and model.is_local(i):
        window, base = c.sliding_window, c.rope_base_local
    return LayerParams(
        wq,
        wk,
        wv,
        bq,
        bk,
        bv,
        w["attn_output"].dequantize(),
        w_gate,
        w_up,
        w["ffn_down"].dequantize(),
        attn_norm=w["attn_norm"],
        ffn_norm=w["ffn_norm"],
        q_norm=w.get("attn_q_norm"),
        k_norm=w.get("attn_k_norm"),
        post_attn_norm=w.get("post_attention_norm") if gemma else None,
        post_ffn_norm=w.get("post_ffw_norm") if gemma else None,
        window=window,
        rope_base=base,
    )


def build_training_weights(model: DecoderModel) -> TrainingWeights:
    """Dequantize every matrix of ``model`` (float32); raises UnsupportedModelError for a
    family the training forward does not cover."""
    if not isinstance(model, (LlamaModel, Gemma3Model)) or getattr(model.config, "n_experts", 0):
        raise UnsupportedModelError(f"no training forward for the {model.config.architecture} family")
    c = model.config
    if c.head_dim_k != c.head_dim_v:
        raise UnsupportedModelError("the training forward needs equal key and value head sizes")
    return TrainingWeights(
        layers=tuple(_layer_params(model, i) for i in range(c.n_layers)),
        head=model.output.dequantize(),
        output_norm=model.output_norm,
        neox=model.rope_style == ROPE_NEOX,
        gelu=isinstance(model, Gemma3Model),
        n_heads=c.n_heads,
        n_kv_heads=c.n_kv_heads,
        head_dim=c.head_dim_k,
        n_rot=c.n_rot,
        eps=c.norm_eps,
    )


_CACHE: weakref.WeakKeyDictionary[DecoderModel, TrainingWeights] = weakref.WeakKeyDictionary()


def training_weights(model: DecoderModel) -> TrainingWeights:
    """The model's training weights, dequantized on the first call and kept while the model lives."""
    weights = _CACHE.get(model)
    if weights is None:
        weights = _CACHE[model] = build_training_weights(model)
    return weights
