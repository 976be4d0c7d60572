"""nanochat's tokenizer: raw-byte BPE read from ``tokenizer.bin`` (magic ``NCTOKz01``).

Unlike the GGUF vocabularies (``bpe.py``), this one works in raw byte space: tokens 0..255
are the single bytes, merge ``i`` makes token ``256 + i`` from two earlier tokens, and the
special tokens (``<|bos|>``, ``<|user_start|>``...) come last, ``256 + n_merges + k``. The
format is the reference port's (fucina ``examples/nanochat/FORMATS.md``).

Encoding is tiktoken's ``encode_ordinary``: nanochat's split pattern cuts the text into
chunks, and inside a chunk the adjacent pair whose merge has the lowest rank is merged until
none is left (the leftmost of equals first). Text never becomes a special token here: the
chat protocol places special ids itself.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import regex

MAGIC = b"NCTOKz01"
VERSION = 1

# nanochat/tokenizer.py SPLIT_PATTERN: GPT-4's, with numbers split into runs of one or two
# digits (not three). The ``regex`` module has the possessive quantifiers it uses.
SPLIT_PATTERN = regex.compile(
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}"""
    r"""| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
)

# nanochat's special tokens in their canonical order (nanochat/tokenizer.py SPECIAL_TOKENS).
SPECIAL_TOKENS = (
    "<|bos|>",
    "<|user_start|>",
    "<|user_end|>",
    "<|assistant_start|>",
    "<|assistant_end|>",
    "<|python_start|>",
    "<|python_end|>",
    "<|output_start|>",
    "<|output_end|>",
)


class NanochatTokenizerError(ValueError):
    """A tokenizer.bin that cannot be read; the message names the file and the problem."""


@dataclass(frozen=True)
class TokenizerFile:
    """The content of a tokenizer.bin: merges in rank order and the special-token strings."""

    merges: tuple[tuple[int, int], ...]  # merge i makes token 256 + i
    specials: tuple[str, ...]  # ids 256 + len(merges) + k

    @property
    def n_vocab(self) -> int:
        return 256 + len(self.merges) + len(self.specials)

    def to_bytes(self) -> bytes:
        """The file's bytes (FORMATS.md: all integers little-endian)."""
        out = [MAGIC, struct.pack("<IIII", VERSION, self.n_vocab, len(self.merges), len(self.specials))]
        out += [struct.pack("<II", left, right) for left, right in self.merges]
        base = 256 + len(self.merges)
        for k, name in enumerate(self.specials):
            raw = name.encode("utf-8")
            out.append(struct.pack("<IH", base + k, len(raw)) + raw)
        return b"".join(out)


def read_tokenizer_file(path: Path) -> TokenizerFile:
    """Parse ``path``; NanochatTokenizerError names what is wrong with it."""
    data = Path(path).read_bytes()
    reader = _Reader(data, path)
    if reader.take(8) != MAGIC:
        raise NanochatTokenizerError(f"{path}: not a nanochat tokenizer.bin (magic is not {MAGIC!r})")
    version, n_vocab, n_merges, n_special = reader.unpack("<IIII")
    if version != VERSION:
        raise NanochatTokenizerError(f"{path}: tokenizer.bin version {version} (expected {VERSION})")
    if 256 + n_merges + n_special != n_vocab:
        raise NanochatTokenizerError(
            f"{path}: n_vocab {n_vocab} != 256 + {n_merges} merges + {n_special} specials"
        )
    merges = tuple(reader.unpack("<II") for _ in range(n_merges))
    for i, (left, right) in enumerate(merges):
        if left >= 256 + i or right >= 256 + i:
            raise NanochatTokenizerError(f"{path}: merge {i} uses a token made later ({left}, {right})")
    specials = []
    for k in range(n_special):
        token_id, length = reader.unpack("<IH")
        if token_id != 256 + n_merges + k:
            raise NanochatTokenizerError(
                f"{path}: special {k} has id {token_id}, expected {256 + n_merges + k}"
            )
        specials.append(reader.take(length).decode("utf-8"))
    return TokenizerFile(merges, tuple(specials))


class _Reader:
    def __init__(self, data: bytes, path: Path):
        self.data, self.path, self.at = data, path, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise NanochatTokenizerError(f"{self.path}: truncated at byte {self.at}")
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return chunk

    def unpack(self, fmt: str) -> tuple:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))


class NanochatTokenizer:
    """Encode / decode with a tokenizer.bin's merges; special ids by name."""

    def __init__(self, spec: TokenizerFile):
        self.n_vocab = spec.n_vocab
        self.n_merges = len(spec.merges)
        # (left, right) -> merged id; a lower id is an earlier (higher-priority) merge.
        self._merges = {pair: 256 + i for i, pair in enumerate(spec.merges)}
        pieces = [bytes([b]) for b in range(256)]
        for left, right in spec.merges:
            pieces.append(pieces[left] + pieces[right])
        pieces += [name.encode("utf-8") for name in spec.specials]
        self._pieces = pieces
        self._special_ids = {name: 256 + self.n_merges + k for k, name in enumerate(spec.specials)}
        self._chunk_cache: dict[str, tuple[int, ...]] = {}

    @classmethod
    def load(cls, path: Path) -> NanochatTokenizer:
        return cls(read_tokenizer_file(path))

    def special_id(self, name: str) -> int:
        """The id of special token ``name``; NanochatTokenizerError when the file has none."""
        try:
            return self._special_ids[name]
        except KeyError:
            raise NanochatTokenizerError(f"the tokenizer has no special token {name}") from None

    def is_special(self, token_id: int) -> bool:
        return token_id >= 256 + self.n_merges

    def token_bytes(self, token_id: int) -> bytes:
        """A token's raw bytes (a special token's are its ``<|name|>`` text)."""
        return self._pieces[token_id]

    def encode(self, text: str) -> list[int]:
        """tiktoken ``encode_ordinary``: no special token is recognized or added."""
        ids: list[int] = []
        for chunk in SPLIT_PATTERN.findall(text):
            cached = self._chunk_cache.get(chunk)
            if cached is None:
                cached = self._encode_chunk(chunk.encode("utf-8"))
                if len(self._chunk_cache) < 65536:
                    self._chunk_cache[chunk] = cached
            ids.extend(cached)
        return ids

    def decode(self, ids: list[int]) -> bytes:
        """The concatenated bytes of ``ids`` (may end inside a UTF-8 code point)."""
        return b"".join(self._pieces[i] for i in ids)

    def _encode_chunk(self, chunk: bytes) -> tuple[int, ...]:
        """Merge the lowest-ranked adjacent pair until no pair has a merge."""
        ids = list(chunk)
        merges = self._merges
        while len(ids) >= 2:
            best_at, best_id = -1, None
            for i in range(len(ids) - 1):
                merged = merges.get((ids[i], ids[i + 1]))
                if merged is not None and (best_id is None or merged < best_id):
                    best_at, best_id = i, merged
            if best_id is None:
                break
            ids[best_at : best_at + 2] = [best_id]
        return tuple(ids)
