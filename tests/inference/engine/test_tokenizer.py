"""Tokenizers rebuilt from GGUF metadata agree with llama.cpp token for token.

The goldens were recorded by ``scripts/record_tokenizer_goldens.py`` with llama-cpp-python on
the same model files and the corpus in ``tests/fixtures/tokenizer_corpus.py``.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from inference.engine.gguf_file import GGUFFile
from inference.engine.tokenizer import Tokenizer, TokenizerError, load_tokenizer
from inference.engine.tokenizer.pretokenizers import PreTokenizer, collapse, collapse_pattern
from tests.fixtures.model_files import default_model_path, optional_model_path
from tests.fixtures.tokenizer_corpus import CORPUS

GOLDENS_DIR = Path(__file__).resolve().parents[2] / "goldens"
MODELS = ["default", "gemma-3-270m-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct.gguf"]


def model_path(name: str) -> Path:
    return default_model_path() if name == "default" else optional_model_path(name)


@cache
def metadata(name: str) -> dict:
    return GGUFFile(model_path(name)).metadata


@cache
def tokenizer(name: str) -> Tokenizer:
    return load_tokenizer(metadata(name))


@cache
def golden(name: str) -> dict:
    return json.loads((GOLDENS_DIR / f"tokenizer_{model_path(name).stem}.json").read_text(encoding="utf-8"))


@pytest.fixture(params=MODELS)
def model(request) -> str:
    return request.param


def test_goldens_were_recorded_on_the_current_corpus(model):
    assert [case["text"] for case in golden(model)["cases"]] == CORPUS
    assert len(CORPUS) >= 200


@pytest.mark.parametrize("parse_special", [True, False])
def test_encode_matches_llama_cpp_on_corpus(model, parse_special):
    tok = tokenizer(model)
    key = "ids" if parse_special else "ids_no_special"
    mismatches = [
        (case["text"], ours, case[key])
        for case in golden(model)["cases"]
        if (ours := tok.encode(case["text"], parse_special=parse_special)) != case[key]
    ]
    assert not mismatches, f"{len(mismatches)} strings differ, first: {mismatches[0]!r}"


def test_vocabulary_facts_match_llama_cpp(model):
    tok, ref = tokenizer(model), golden(model)
    assert tok.vocab_size == ref["vocab_size"]
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (ref["bos_id"], ref["eos_id"], ref["add_bos"])
    assert tok.eog_ids == frozenset(ref["eog_ids"])
    assert [i for i in range(tok.vocab_size) if tok.is_control(i)] == ref["control_ids"]


def test_token_bytes_match_llama_cpp_pieces(model):
    tok = tokenizer(model)
    wrong = {i: tok.token_bytes(int(i)) for i, hex_piece in golden(model)["pieces"].items()}
    wrong = {i: b for i, b in wrong.items() if b.hex() != golden(model)["pieces"][i]}
    assert not wrong, f"{len(wrong)} pieces differ, e.g. {next(iter(wrong.items()))}"


def test_decode_inverts_encode(model):
    tok = tokenizer(model)
    for text in CORPUS:
        # SmolLM2's vocabulary has no token for a few control bytes (e.g. 0x1D); llama.cpp drops them
        representable = "".join(ch for ch in text if tok.encode(ch, parse_special=False))
        assert tok.decode(tok.encode(text)) == representable, text


def test_streamed_token_bytes_rebuild_the_text(model):
    tok = tokenizer(model)
    text = "Emoji 👨‍👩‍👧‍👦 and 中文 split across byte tokens: 𝕳𝖊𝖑𝖑𝖔 ꦲꦏ꧀"
    streamed = b"".join(tok.token_bytes(i) for i in tok.encode(text))
    assert streamed.decode("utf-8") == text


def test_control_tokens_stream_as_nothing_but_decode_as_text(model):
    tok = tokenizer(model)
    control = next(i for i in sorted(tok.eog_ids) if tok.is_control(i))
    assert tok.token_bytes(control) == b""
    assert tok.token_bytes(control, special=True) == tok.token_text(control).encode()
    assert tok.decode([control]) == tok.token_text(control)


def test_add_bos_prepends_bos(model):
    tok = tokenizer(model)
    assert tok.encode("hi", add_bos=True) == [tok.bos_id, *tok.encode("hi")]


def test_special_tokens_are_recognized_only_when_parsing_specials():
    tok = tokenizer("qwen2.5-coder-0.5b-instruct.gguf")
    im_start = tok.encode("<|im_start|>")
    assert im_start == [151644] and tok.is_control(151644)
    assert len(tok.encode("<|im_start|>", parse_special=False)) > 1
    # user-defined tokens (Qwen's <tool_call>) are cut out even without special parsing
    assert tok.encode("<tool_call>", parse_special=False) == [151657]


def test_gemma_chat_markers_and_eog():
    tok = tokenizer("gemma-3-270m-q4_k_m.gguf")
    ids = tok.encode("<start_of_turn>user\nHi<end_of_turn>")
    assert ids[0] == 105 and ids[-1] == 106
    assert {1, 106} <= tok.eog_ids and tok.add_bos and tok.bos_id == 2


def test_unicode_categories_follow_llama_cpp_tables():
    assert collapse("a1 .") == "a1 ."
    assert collapse("é٣\u00a0\u200b😀\u0301") == "\xd2\xd1\x0b\xd0\xd5\xd4"
    # CJK Extension H (Unicode 15.0) is a letter to llama.cpp; Garay (Unicode 16) is not yet
    assert collapse("\U00031350\U00010d50") == "\xd2\xd0"


def test_collapsed_pattern_keeps_ascii_members_of_each_category():
    assert collapse_pattern(r"[^\s\p{L}\p{N}]+|\p{N}") == "[^\\s\xd2A-Za-z\xd10-9]+|[\xd10-9]"


def test_smollm_pretokenizer_splits_every_digit():
    words = PreTokenizer("smollm").split("abc 12345 x'll")
    assert words == ["abc", " ", "1", "2", "3", "4", "5", " x", "'ll"]


def test_qwen2_pretokenizer_keeps_newlines_with_punctuation():
    assert PreTokenizer("qwen2").split("Hi!\n\n  there") == ["Hi", "!\n\n", " ", " there"]


def test_unsupported_tokenizers_are_rejected():
    with pytest.raises(TokenizerError, match="pre-tokenizer"):
        PreTokenizer("no-such-pre")
    with pytest.raises(TokenizerError, match="tokenizer model"):
        load_tokenizer({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})


def spm_metadata(add_space_prefix: bool) -> dict:
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    pieces = {"▁": -3.0, "a": -1.0, "b": -1.0, "ab": -2.0, "▁a": -0.5, "ba": -0.5, "<ctrl>": 0.0}
    tokens = ["<unk>", "<s>", "</s>", *byte_tokens, *pieces]
    types = [2, 3, 3] + [6] * 256 + [1] * (len(pieces) - 1) + [3]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.array([0.0] * 259 + list(pieces.values()), dtype=np.float32),
        "tokenizer.ggml.token_type": np.array(types, dtype=np.int32),
        "tokenizer.ggml.add_space_prefix": add_space_prefix,
    }


def test_sentencepiece_merges_highest_score_first_then_leftmost():
    tok = load_tokenizer(spm_metadata(add_space_prefix=False))
    pieces = lambda text: [tok.token_text(i) for i in tok.encode(text)]
    assert pieces("aba") == ["a", "ba"]  # "ba" (-0.5) beats "ab" (-2.0)
    assert pieces("abab") == ["a", "ba", "b"]  # the leftmost "ba" wins, blocking the other merges
    assert pieces(" a") == ["▁a"]
    assert pieces("ac") == ["a", "<0x63>"]  # no token for "c": byte fallback


def test_sentencepiece_space_prefix_is_added_and_removed():
    tok = load_tokenizer(spm_metadata(add_space_prefix=True))
    ids = tok.encode("a<ctrl>a")
    assert [tok.token_text(i) for i in ids] == ["▁a", "<ctrl>", "▁a"]
    assert tok.decode(ids) == "a<ctrl>a"
    assert tok.add_bos and tok.bos_id == 1 and tok.eog_ids == frozenset({2})


def test_bpe_merges_are_cut_after_position_zero_and_kept_only_when_they_make_a_token():
    from inference.engine.tokenizer.bpe import _merge_pairs

    vocab = {" a": 0, "b": 1, " ab": 2, "c": 3, "d": 4, "cd": 5, "x y": 6}
    merges = [" a b", "c d", "c x", "nospace", "x y z"]
    # " a b": the leading space belongs to the left part; "c x" makes no token; "x y z" makes
    # "xy z" / "x" + "y z": cut at the first space, "xy z" is not a token.
    assert _merge_pairs(merges, vocab) == [(" a", "b"), ("c", "d")]
    with pytest.raises(TokenizerError, match="merges"):
        _merge_pairs(None, vocab)
