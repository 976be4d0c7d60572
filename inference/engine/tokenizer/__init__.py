"""Tokenizers rebuilt from GGUF metadata, token-for-token identical to llama.cpp.

``load_tokenizer(GGUFFile(path).metadata)`` returns a :class:`Tokenizer`:

- ``tokenizer.ggml.model == "gpt2"``: byte-level BPE with llama.cpp's pre-tokenizer for
  ``tokenizer.ggml.pre`` (smollm, qwen2, llama-bpe, gpt-2, default and their aliases);
- ``tokenizer.ggml.model == "llama"``: SentencePiece with scores and byte fallback.

Choices where llama.cpp offers two behaviours: ``token_bytes(id)`` follows
``token_to_piece(special=False)`` (control tokens give ``b""``), while ``decode`` renders
control tokens as their text so that ``decode(encode(s)) == s``.
"""

from __future__ import annotations

from typing import Any

from .base import Tokenizer
from .bpe import BPETokenizer
from .spm import SPMTokenizer
from .vocab import TokenizerError, load_vocabulary

__all__ = ["Tokenizer", "TokenizerError", "load_tokenizer"]


def load_tokenizer(metadata: dict[str, Any]) -> Tokenizer:
    """The tokenizer a GGUF file's metadata describes; :class:`TokenizerError` if unsupported."""
    vocab = load_vocabulary(metadata)
    if vocab.model == "gpt2":
        return BPETokenizer(vocab, metadata)
    return SPMTokenizer(vocab)
