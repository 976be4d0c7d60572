"""What every decoder family shares: weight loading, the layer loop, the output head.

A family subclasses :class:`DecoderModel`, reads its config and weights, and writes
``block`` — one transformer layer — in its own file.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from ..gguf_file import GGUFFile
from ..kv_cache import KVCache
from ..layers import apply_rope, attention, rms_norm, rope_angles
from ..quants import QuantMatrix, load_matrix
from .config import ModelConfig


def linear(weight: QuantMatrix, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """x (n, cols) @ weight.T (+ bias) -> (n, rows); one token goes through the matvec kernel."""
    out = weight.matvec(x[0])[None, :] if x.shape[0] == 1 else weight.matmul(np.ascontiguousarray(x))
    return out + bias if bias is not None else out


class DecoderModel(ABC):
    """A decoder-only transformer over a GGUF file; subclasses define ``block``."""

    rope_style: str = "norm"

    def __init__(self, f: GGUFFile, config: ModelConfig):
        self.file = f
        self.config = config
        self.token_embd = self.matrix("token_embd.weight")
        self.output_norm = self.vector("output_norm.weight")
        # Tied embeddings: without output.weight the embedding matrix is the head.
        self.output = self.matrix("output.weight") if f.has_tensor("output.weight") else self.token_embd

    # -- weights -------------------------------------------------------------------------
    def matrix(self, name: str) -> QuantMatrix:
        t = self.file.tensor(name)
        return load_matrix(t.type, t.data, t.shape, name)

    def vector(self, name: str) -> np.ndarray:
        return np.asarray(self.file.tensor(name).data, dtype=np.float32)

    def optional_vector(self, name: str) -> np.ndarray | None:
        return self.vector(name) if self.file.has_tensor(name) else None

    # -- forward ---------------------------------------------------------------------------
    def embed(self, tokens: np.ndarray) -> np.ndarray:
        return self.token_embd.take_rows(tokens)  # (n, n_embd)

    @abstractmethod
    def block(self, layer: int, x: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        """One transformer layer over x (n, n_embd) at positions start..start+n."""

    def forward(self, tokens: list[int], cache: KVCache, all_logits: bool = False) -> np.ndarray:
        """Run ``tokens`` after what ``cache`` holds; return the last position's logits
        (vocab,) or, with ``all_logits``, every position's (n, vocab)."""
        n = len(tokens)
        cache.check_room(n)
        start = cache.n_tokens
        x = self.embed(np.asarray(tokens, dtype=np.int64))  # (n, n_embd)
        for layer in range(self.config.n_layers):
            x = self.block(layer, x, cache, start)
        cache.commit(tokens)
        if not all_logits:
            x = x[-1:]
        logits = linear(self.output, rms_norm(x, self.output_norm, self.config.norm_eps))  # (n, vocab)
        return logits if all_logits else logits[0]

    # -- shared attention steps ------------------------------------------------------------
    def rope(self, x: np.ndarray, start: int, base: float | None = None) -> np.ndarray:
        """Rotate (n, heads, head_dim) at positions start..start+n."""
        c = self.config
        positions = np.arange(start, start + x.shape[0])
        cos, sin = rope_angles(positions, c.n_rot, c.rope_base if base is None else base)
        return apply_rope(x, cos, sin, self.rope_style)

    def split_heads(self, x: np.ndarray, n_heads: int) -> np.ndarray:
        return x.reshape(x.shape[0], n_heads, -1)  # (n, heads, head_dim)

    def attend(
        self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, cache: KVCache, start: int,
        scale: float | None = None, window: int = 0,
    ) -> np.ndarray:
        """Store k, v rows, attend with q; returns (n, n_heads * head_dim_v)."""
        cache.write(layer, start, k, v)
        if scale is None:
            scale = 1.0 / np.sqrt(self.config.head_dim_k)
        out = attention(q, cache, layer, start, scale, window)  # (n, heads, hd_v)
        return out.reshape(out.shape[0], -1)
