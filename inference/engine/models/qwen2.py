"""Qwen2 / Qwen2.5: the llama block with q/k/v biases and half-split (NeoX) RoPE."""

from __future__ import annotations

from .layers import ROPE_NEOX
from .llama import LlamaModel


class Qwen2Model(LlamaModel):
    # The biases load through LlamaModel.load_layer's optional attn_{q,k,v}.bias.
    rope_style = ROPE_NEOX
