"""Byte-level BPE (``tokenizer.ggml.model == "gpt2"``): SmolLM2, Qwen2.5, Llama 3 ...

Words come from :class:`PreTokenizer` (llama.cpp's splitting); merging them is HF
``tokenizers``' BPE with the GGUF's vocabulary and merge ranks. Both merge the lowest-ranked
adjacent pair first, leftmost on ties, so they agree with llama.cpp's ``llm_tokenizer_bpe``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE
from tokenizers.pre_tokenizers import ByteLevel

from .base import Tokenizer
from .pretokenizers import PreTokenizer
from .vocab import K, TokenizerError, Vocabulary


@lru_cache(maxsize=1)
def byte_of_char() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


class BPETokenizer(Tokenizer):
    """A GGUF byte-level BPE vocabulary with the pre-tokenizer ``tokenizer.ggml.pre`` names."""

    def __init__(self, vocab: Vocabulary, metadata: dict[str, Any]):
        super().__init__(vocab)
        self._pre = PreTokenizer(metadata.get(K.PRE) or "default")
        merges = _merge_pairs(metadata.get(K.MERGES), vocab.token_to_id)
        model = BPE(vocab=vocab.token_to_id, merges=merges, ignore_merges=self._pre.ignore_merges)
        self._hf = HFTokenizer(model)
        self._hf.pre_tokenizer = ByteLevel(add_prefix_space=False, use_regex=False)
        self._byte_of_char = byte_of_char()

    @property
    def pre(self) -> str:
        return self._pre.pre

    def _encode_text(self, text: str, after_special: bool) -> list[int]:
        words = self._pre.split(text)
        if not words:
            return []
        return self._hf.encode(words, is_pretokenized=True, add_special_tokens=False).ids

    def _normal_piece(self, text: str) -> bytes:
        table = self._byte_of_char
        try:
            return bytes(table[c] for c in text)
        except KeyError:
            return _decode_with_unknown(text, table)


def _merge_pairs(merges: Any, token_to_id: dict[str, int]) -> list[tuple[str, str]]:
    """The GGUF's merges ("left right") as pairs, in rank order. One comprehension over 151k
    merges (Qwen2.5): a loop with a branch per merge was a quarter of the tokenizer's load."""
    if not isinstance(merges, list):
        raise TokenizerError("BPE vocabulary without tokenizer.ggml.merges")
    # Cut at the first space after position 0, as llama.cpp does: partition's first space
    # unless the merge starts with one.
    parts = [_cut_after_first(merge) if merge[:1] == " " else merge.partition(" ") for merge in merges]
    # HF refuses merges whose result is not a token; llama.cpp would fall back to bytes there.
    return [(left, right) for left, space, right in parts if space and left + right in token_to_id]


def _cut_after_first(merge: str) -> tuple[str, str, str]:
    """``str.partition`` at the first space after position 0 (("", "", "") when there is none)."""
    cut = merge.find(" ", 1)
    return (merge[:cut], " ", merge[cut + 1 :]) if cut > 0 else ("", "", "")


def _decode_with_unknown(text: str, table: dict[str, int]) -> bytes:
    # llama.cpp's llama_decode_text marks characters outside the byte map like this
    out = bytearray()
    for c in text:
        if c in table:
            out.append(table[c])
        else:
            out += b"[UNK_BYTE_0x" + c.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
    return bytes(out)
