"""nanochat's tokenizer.bin and its raw-byte BPE: the file round-trips, every text comes back
byte for byte, the split pattern cuts as nanochat's does (digits in runs of at most two,
contractions, whitespace before a word), merges apply lowest rank first, specials are ids only."""

from __future__ import annotations

import pytest

from inference.engine.tokenizer.nanochat_bpe import (
    SPECIAL_TOKENS,
    SPLIT_PATTERN,
    NanochatTokenizer,
    NanochatTokenizerError,
    TokenizerFile,
    read_tokenizer_file,
)
from tests.fixtures.synthetic_nanochat import tokenizer_file

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is 1234 * 5678? It's 7006652.",
    "  leading spaces, tabs\tand\r\nnewlines\n\n",
    "héllo wörld — ünïcödé, 日本語のテキスト, emoji 🙂👍🏽",
    "I'm sure they've said we'll go; you're right, it's HE'S.",
    "<|user_start|> is just text here",
    "",
]


@pytest.fixture(scope="module")
def spec() -> TokenizerFile:
    return tokenizer_file()


@pytest.fixture(scope="module")
def tok(spec) -> NanochatTokenizer:
    return NanochatTokenizer(spec)


def test_the_file_round_trips(spec, tmp_path):
    path = tmp_path / "tokenizer.bin"
    path.write_bytes(spec.to_bytes())
    again = read_tokenizer_file(path)
    assert again == spec
    assert again.n_vocab == 256 + 60 + 9
    assert path.read_bytes()[:8] == b"NCTOKz01"


@pytest.mark.parametrize("text", TEXTS)
def test_every_text_comes_back_byte_for_byte(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text.encode("utf-8")
    assert all(0 <= i < 256 + tok.n_merges for i in ids)  # text never becomes a special token


def test_merges_make_multi_byte_tokens(tok):
    ids = tok.encode("The capital of France")
    assert len(ids) < len("The capital of France")
    assert any(i >= 256 for i in ids)


def test_the_split_pattern_is_nanochats():
    assert SPLIT_PATTERN.findall("12345 apples") == ["12", "34", "5", " apples"]
    assert SPLIT_PATTERN.findall("I'm they've") == ["I", "'m", " they", "'ve"]
    assert SPLIT_PATTERN.findall("a  b\n\nc") == ["a", " ", " b", "\n\n", "c"]
    assert SPLIT_PATTERN.findall("x!!?\n") == ["x", "!!?\n"]


def test_lowest_rank_merges_first():
    """With merges (a, b) -> 256, (b, c) -> 257 and (256, c) -> 258, "abc" is a+b first."""
    a, b, c = ord("a"), ord("b"), ord("c")
    spec = TokenizerFile(((a, b), (b, c), (256, c)), SPECIAL_TOKENS)
    tok = NanochatTokenizer(spec)
    assert tok.encode("abc") == [258]
    spec = TokenizerFile(((b, c), (a, b)), SPECIAL_TOKENS)
    assert NanochatTokenizer(spec).encode("abc") == [a, 256]


def test_specials_by_name(tok):
    assert tok.special_id("<|bos|>") == 256 + 60
    assert tok.special_id("<|output_end|>") == 256 + 60 + 8
    assert tok.token_bytes(tok.special_id("<|python_start|>")) == b"<|python_start|>"
    assert tok.is_special(tok.special_id("<|bos|>")) and not tok.is_special(255)
    with pytest.raises(NanochatTokenizerError, match="no special token <|nope|>"):
        tok.special_id("<|nope|>")


def test_bad_files_are_refused_by_name(spec, tmp_path):
    path = tmp_path / "tokenizer.bin"
    path.write_bytes(b"GGUF" + spec.to_bytes()[4:])
    with pytest.raises(NanochatTokenizerError, match="not a nanochat tokenizer.bin"):
        read_tokenizer_file(path)
    path.write_bytes(spec.to_bytes()[:100])
    with pytest.raises(NanochatTokenizerError, match="truncated"):
        read_tokenizer_file(path)
    broken = TokenizerFile(((300, 1),), SPECIAL_TOKENS)
    path.write_bytes(broken.to_bytes())
    with pytest.raises(NanochatTokenizerError, match="merge 0 uses a token made later"):
        read_tokenizer_file(path)
