"""Gemma 4's per-layer embeddings (the E2B/E4B checkpoints), as llama.cpp's ``gemma4`` graph
computes them.

Beside the ordinary token embedding, each token looks up one row of ``per_layer_token_embd``
(n_layers x n_embd_per_layer values, scaled by sqrt(n_embd_per_layer)); a projection of the
scaled token embedding (``per_layer_model_proj``, scaled by 1/sqrt(n_embd), RMS-normed per
layer chunk with ``per_layer_proj_norm``) is added to it and the sum scaled by 1/sqrt(2).
Chunk ``l`` of that is layer ``l``'s input: after the layer's feed-forward residual, a gated
projection (``inp_gate``, GELU, times the input, ``proj``, RMS norm ``post_norm``) is added
to the residual stream, before the layer's output scale.

Every step is per token, so a row's result does not depend on the rows sharing its forward.
"""

from __future__ import annotations

import numpy as np

from ..fused.rowops import gelu_tanh_f16
from ..gguf_file import GGUFError, GGUFFile
from ..quants import QuantMatrix, load_matrix
from ..quants.lookup import MappedRows
from .base import linear
from .layers import rms_norm

INPUT_SCALE = np.float32(1.0) / np.sqrt(np.float32(2.0))  # llama.cpp: 1.0f / sqrtf(2.0f)


def _matrix(f: GGUFFile, name: str, shape: tuple[int, int], lookup: bool = False) -> QuantMatrix | MappedRows:
    """Tensor ``name`` as a matrix (a table read in place when it is only ``lookup``-ed),
    refused with its name when its shape is not ``shape``."""
    t = f.tensor(name)
    if tuple(t.shape) != shape:
        raise GGUFError(f"{f.path}: {name} has shape {tuple(t.shape)}, expected {shape}")
    if lookup:
        return MappedRows(t.type, t.data, t.shape, name)
    return load_matrix(t.type, t.data, t.shape, name)


def _vector(f: GGUFFile, name: str, size: int) -> np.ndarray:
    v = np.asarray(f.tensor(name).data, np.float32).reshape(-1)  # (size,)
    if v.shape[0] != size:
        raise GGUFError(f"{f.path}: {name} has {v.shape[0]} values, expected {size}")
    return v


class PerLayerInputs:
    """The model-level tensors: every layer's input rows for a run of tokens."""

    def __init__(self, f: GGUFFile, n_layers: int, n_embd: int, width: int, vocab: int):
        self.n_layers, self.width = n_layers, width
        self.tok_embd = _matrix(f, "per_layer_token_embd.weight", (vocab, n_layers * width), lookup=True)
        self.model_proj = _matrix(f, "per_layer_model_proj.weight", (n_layers * width, n_embd))
        self.proj_norm = _vector(f, "per_layer_proj_norm.weight", width)
        self.token_scale = np.sqrt(np.float32(width))  # llama.cpp: sqrtf(n_embd_per_layer)
        self.proj_scale = np.float32(1.0) / np.sqrt(np.float32(n_embd))  # 1.0f / sqrtf(n_embd)

    def __call__(self, tokens: np.ndarray, x_scaled: np.ndarray, eps: float) -> np.ndarray:
        """Layer inputs (n_layers, n, width) for tokens (n,) whose scaled embedding is x_scaled
        (n, n_embd)."""
        n = len(tokens)
        tok = self.tok_embd.take_rows(tokens) * self.token_scale  # (n, n_layers * width)
        proj = linear(self.model_proj, x_scaled) * self.proj_scale  # (n, n_layers * width)
        proj = rms_norm(proj.reshape(n, self.n_layers, self.width), self.proj_norm, eps)  # (n, L, width)
        inputs = (proj + tok.reshape(n, self.n_layers, self.width)) * INPUT_SCALE  # (n, L, width)
        return np.ascontiguousarray(inputs.transpose(1, 0, 2))  # (L, n, width)


class PerLayerInject:
    """One layer's gated projection of its per-layer input into the residual stream."""

    def __init__(self, f: GGUFFile, layer: int, n_embd: int, width: int):
        p = f"blk.{layer}."
        self.inp_gate = _matrix(f, p + "inp_gate.weight", (width, n_embd))
        self.proj = _matrix(f, p + "proj.weight", (n_embd, width))
        self.post_norm = _vector(f, p + "post_norm.weight", n_embd)

    def __call__(self, x: np.ndarray, inputs: np.ndarray, eps: float) -> np.ndarray:
        """x (n, n_embd) plus the normed projection of gelu(inp_gate x) * inputs (n, width)."""
        gated = gelu_tanh_f16(linear(self.inp_gate, x)) * inputs  # (n, width)
        return x + rms_norm(linear(self.proj, gated), self.post_norm, eps)  # (n, n_embd)
