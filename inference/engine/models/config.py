"""The hyperparameters of a decoder, read from GGUF metadata."""

from __future__ import annotations

from dataclasses import dataclass

from ..gguf_file import GGUFError, GGUFFile
from ..kv_cache import KVGeometry


@dataclass(frozen=True)
class ModelConfig:
    """Everything the forward pass needs to know about shapes and constants."""

    architecture: str
    n_layers: int
    n_embd: int
    n_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim_k: int
    head_dim_v: int
    n_rot: int
    rope_base: float
    norm_eps: float
    n_ctx_train: int
    vocab_size: int
    # Mixture of experts (qwen3moe); zero elsewhere.
    n_experts: int = 0
    n_experts_used: int = 0
    n_ff_expert: int = 0
    # Sliding-window attention (gemma3).
    sliding_window: int = 0
    rope_base_local: float = 0.0

    @property
    def kv_geometry(self) -> KVGeometry:
        return KVGeometry(self.n_layers, self.n_kv_heads, self.head_dim_k, self.head_dim_v)

    @classmethod
    def from_gguf(cls, f: GGUFFile, **overrides) -> ModelConfig:
        """Read the standard ``<arch>.*`` keys; families pass what differs as overrides."""
        arch = f.architecture

        def need(key: str):
            value = f.arch_value(key)
            if value is None:
                raise GGUFError(f"{f.path}: required metadata key {arch}.{key} is missing")
            return value

        n_embd, n_heads = int(need("embedding_length")), int(need("attention.head_count"))
        head_dim = int(f.arch_value("attention.key_length", n_embd // n_heads))
        fields = dict(
            architecture=arch,
            n_layers=int(need("block_count")),
            n_embd=n_embd,
            n_ff=int(f.arch_value("feed_forward_length", 0)),
            n_heads=n_heads,
            n_kv_heads=int(f.arch_value("attention.head_count_kv", n_heads)),
            head_dim_k=head_dim,
            head_dim_v=int(f.arch_value("attention.value_length", head_dim)),
            n_rot=int(f.arch_value("rope.dimension_count", head_dim)),
            rope_base=float(f.arch_value("rope.freq_base", 10000.0)),
            norm_eps=float(f.arch_value("attention.layer_norm_rms_epsilon", 1e-5)),
            n_ctx_train=int(f.arch_value("context_length", 2048)),
            vocab_size=len(f.require("tokenizer.ggml.tokens")),
        )
        fields.update(overrides)
        return cls(**fields)
