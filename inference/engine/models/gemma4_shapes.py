"""Gemma 4's per-layer geometry, read from GGUF metadata as llama.cpp reads it.

Unlike every other family here, a Gemma 4 layer has its own attention shape: local
(sliding-window) layers and global layers differ in head size, rotated dimensions, RoPE base
and number of kv heads, and the last ``attention.shared_kv_layers`` layers keep no cache rows
of their own but attend over those of the last earlier layer of the same kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..gguf_file import GGUFError, GGUFFile
from .config import ModelConfig

LOCAL_ROPE_BASE = 10000.0  # llama.cpp's value when rope.freq_base_swa is absent


@dataclass(frozen=True)
class LayerShape:
    """One layer's attention geometry."""

    local: bool  # sliding-window attention (else global)
    n_kv_heads: int
    head_dim: int  # k and v heads are the same size (llama.cpp refuses otherwise)
    n_rot: int
    rope_base: float
    kv_layer: int  # whose cache rows this layer writes and reads: itself, or a shared earlier layer

    @property
    def owns_kv(self) -> bool:
        return self.kv_layer < 0


def per_layer(f: GGUFFile, key: str, n_layers: int, default=None) -> list:
    """A per-layer metadata value: one entry per layer from an array, or a scalar repeated."""
    value = f.arch_value(key, default)
    if value is None:
        raise GGUFError(f"{f.path}: required metadata key {f.architecture}.{key} is missing")
    if np.ndim(value) == 0:
        return [value] * n_layers
    values = list(np.asarray(value).tolist())
    if len(values) != n_layers:
        raise GGUFError(f"{f.path}: {f.architecture}.{key} has {len(values)} entries for {n_layers} layers")
    return values


def local_pattern(f: GGUFFile, n_layers: int) -> list[bool]:
    """Which layers use the sliding window: the key's per-layer booleans, or (a scalar n)
    every layer but each n-th, as llama.cpp's set_swa_pattern reads a scalar."""
    value = f.arch_value("attention.sliding_window_pattern")
    if value is None:
        raise GGUFError(
            f"{f.path}: required metadata key {f.architecture}.attention.sliding_window_pattern is missing"
        )
    if np.ndim(value) == 0:
        n = int(value)
        return [n == 0 or i % n < n - 1 for i in range(n_layers)]
    return [bool(v) for v in per_layer(f, "attention.sliding_window_pattern", n_layers)]


def layer_shapes(f: GGUFFile, n_layers: int) -> list[LayerShape]:
    """Every layer's geometry; a shared-kv layer reads the rows of the last own-cache layer of
    its kind, which llama.cpp takes to be the last (global) or the one before it (local)."""
    local = local_pattern(f, n_layers)
    kv_heads = [int(v) for v in per_layer(f, "attention.head_count_kv", n_layers)]
    head_global = int(f.arch_value("attention.key_length", 0)) or None
    if head_global is None:
        raise GGUFError(f"{f.path}: required metadata key {f.architecture}.attention.key_length is missing")
    head_local = int(f.arch_value("attention.key_length_swa", head_global))
    for key, want in (("attention.value_length", head_global), ("attention.value_length_swa", head_local)):
        if int(f.arch_value(key, want)) != want:
            raise GGUFError(f"{f.path}: {f.architecture}.{key} differs from its key length (unsupported)")
    rot_global = int(f.arch_value("rope.dimension_count", head_global))
    rot_local = int(f.arch_value("rope.dimension_count_swa", rot_global))
    base_global = float(f.arch_value("rope.freq_base", 10000.0))
    base_local = float(f.arch_value("rope.freq_base_swa", LOCAL_ROPE_BASE))
    n_shared = int(f.arch_value("attention.shared_kv_layers", 0))
    if not 0 <= n_shared < n_layers:
        raise GGUFError(f"{f.path}: attention.shared_kv_layers {n_shared} is not below the {n_layers} layers")
    first_shared = n_layers - n_shared
    shapes = []
    for i in range(n_layers):
        kv_layer = -1
        if i >= first_shared:
            # llama.cpp's rule: the last own-cache layer is global, the one before it local.
            kv_layer = first_shared - (2 if local[i] else 1)
            if kv_layer < 0 or local[kv_layer] != local[i]:
                raise GGUFError(
                    f"{f.path}: shared-kv layer {i} would read layer {kv_layer}, not one of its kind"
                )
        shapes.append(
            LayerShape(
                local=local[i],
                n_kv_heads=kv_heads[i],
                head_dim=head_local if local[i] else head_global,
                n_rot=rot_local if local[i] else rot_global,
                rope_base=base_local if local[i] else base_global,
                kv_layer=kv_layer,
            )
        )
    return shapes


def gemma4_config(f: GGUFFile, shapes: list[LayerShape], **overrides) -> ModelConfig:
    """The model's ModelConfig. Its kv geometry is the widest layer's (every layer's rows fit
    in it: a layer uses the first n_kv_heads and head_dim of each row); its head fields are
    the global layers'."""
    arch = f.architecture
    n_heads = per_layer(f, "attention.head_count", len(shapes))
    if len(set(n_heads)) != 1:
        raise GGUFError(f"{f.path}: {arch}.attention.head_count varies by layer (unsupported)")
    widest = max(s.head_dim for s in shapes)
    return ModelConfig(
        architecture=arch,
        n_layers=len(shapes),
        n_embd=int(f.require(f"{arch}.embedding_length")),
        n_ff=max(int(v) for v in per_layer(f, "feed_forward_length", len(shapes), 0)),  # E2B: per layer
        n_heads=int(n_heads[0]),
        n_kv_heads=max(s.n_kv_heads for s in shapes),
        head_dim_k=widest,
        head_dim_v=widest,
        n_rot=max(s.n_rot for s in shapes),
        rope_base=float(f.arch_value("rope.freq_base", 10000.0)),
        norm_eps=float(f.arch_value("attention.layer_norm_rms_epsilon", 1e-6)),
        n_ctx_train=int(f.arch_value("context_length", 2048)),
        vocab_size=len(f.require("tokenizer.ggml.tokens")),
        sliding_window=int(f.arch_value("attention.sliding_window", 0)),
        rope_base_local=float(f.arch_value("rope.freq_base_swa", LOCAL_ROPE_BASE)),
        **overrides,
    )
