"""SentencePiece BPE (``tokenizer.ggml.model == "llama"``): Gemma 3, Llama 2, Mistral ...

llama.cpp's ``llm_tokenizer_spm``: spaces become U+2581, the text is cut into code points,
and adjacent symbols are merged while their concatenation is a vocabulary token, always
taking the pair whose merged token has the highest score (leftmost on ties). Symbols that
end up not being tokens are spelled as ``<0xXX>`` byte tokens. HF's BPE ranks merges by a
merge list instead of token scores, so the algorithm is implemented here with a heap.
"""

from __future__ import annotations

import heapq

from .base import Tokenizer
from .vocab import TokenizerError, Vocabulary

SPACE_ESCAPE = "\u2581"


class SPMTokenizer(Tokenizer):
    """A GGUF SentencePiece vocabulary with scores and byte fallback."""

    def __init__(self, vocab: Vocabulary):
        super().__init__(vocab)
        self._scores = vocab.scores
        self._byte_tokens = [_byte_token(vocab.token_to_id, b) for b in range(256)]

    def _encode_text(self, text: str, after_special: bool) -> list[int]:
        if self._vocab.add_space_prefix and after_special:
            text = " " + text
        return self._merge(text.replace(" ", SPACE_ESCAPE))

    def _normal_piece(self, text: str) -> bytes:
        return text.replace(SPACE_ESCAPE, " ").encode("utf-8")

    def _merge(self, text: str) -> list[int]:
        n = len(text)
        if n == 0:
            return []
        lookup = self._vocab.token_to_id.get
        scores = self._scores
        # symbol i always starts at code point i; merging grows the left symbol in place
        length = [1] * n
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap = []
        for i in range(n - 1):
            token_id = lookup(text[i : i + 2])
            if token_id is not None:
                heap.append((-scores[token_id], i, i + 1, 2))
        heapq.heapify(heap)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if length[left] == 0 or length[right] == 0 or length[left] + length[right] != size:
                continue  # a symbol of this pair was merged since the pair was queued
            length[left] = size
            length[right] = 0
            after = nxt[left] = nxt[right]
            if after >= 0:
                prev[after] = left
                self._push_pair(heap, text, left, after, length, lookup)
            before = prev[left]
            if before >= 0:
                self._push_pair(heap, text, before, left, length, lookup)
        return self._symbols_to_ids(text, length, nxt, lookup)

    def _push_pair(self, heap: list, text: str, left: int, right: int, length: list[int], lookup) -> None:
        size = length[left] + length[right]
        token_id = lookup(text[left : left + size])
        if token_id is not None:
            heapq.heappush(heap, (-self._scores[token_id], left, right, size))

    def _symbols_to_ids(self, text: str, length: list[int], nxt: list[int], lookup) -> list[int]:
        ids: list[int] = []
        i = 0
        while i >= 0:
            piece = text[i : i + length[i]]
            token_id = lookup(piece)
            if token_id is not None:
                ids.append(token_id)
            else:
                ids.extend(self._byte_id(b) for b in piece.encode("utf-8"))
            i = nxt[i]
        return ids

    def _byte_id(self, byte: int) -> int:
        token_id = self._byte_tokens[byte]
        if token_id is None:
            raise TokenizerError(f"vocabulary has no byte token for 0x{byte:02X}")
        return token_id


def _byte_token(token_to_id: dict[str, int], byte: int) -> int | None:
    token_id = token_to_id.get(f"<0x{byte:02X}>")
    if token_id is None and byte < 0x80:
        token_id = token_to_id.get(chr(byte))
    return token_id
