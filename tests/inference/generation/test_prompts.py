"""Raw prompts and fill-in-the-middle prompts (inference/generation/prompts.py) on the real
vocabularies: Qwen2.5-Coder's FIM tokens found and laid out as llama.cpp's format_infill lays
them out, SmolLM2 (no FIM tokens) refused naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference.engine.gguf_file import GGUFFile
from inference.engine.tokenizer import load_tokenizer
from inference.generation.prompts import FIM_BATCH, fim_ids_from, fim_tokens
from inference.model_files import default_model_path, resolve_model
from inference.types import Error, FileContext, FillInMiddle, RawPrompt


def vocabulary(path: Path):
    metadata = GGUFFile(path).metadata
    tokenizer = load_tokenizer(metadata)
    return tokenizer, fim_ids_from(metadata, tokenizer)


@pytest.fixture(scope="module")
def qwen():
    return vocabulary(resolve_model("qwen2.5-coder-0.5b"))  # fetched by the test command


def test_qwen_fim_tokens_are_found(qwen):
    tokenizer, ids = qwen
    texts = {name: tokenizer.token_text(i) for name, i in ids.items()}
    assert texts == {
        "pre": "<|fim_prefix|>",
        "suf": "<|fim_suffix|>",
        "mid": "<|fim_middle|>",
        "pad": "<|fim_pad|>",
        "rep": "<|repo_name|>",
        "sep": "<|file_sep|>",
    }


def plain(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, parse_special=False)


def test_single_file_fim_layout(qwen):
    tokenizer, ids = qwen
    raw = RawPrompt("def f(x):\n    ", fim=FillInMiddle("\n    return y\n"))
    tokens = fim_tokens(tokenizer, ids, raw, 4096, 16)
    prefix, suffix = plain(tokenizer, raw.text), plain(tokenizer, raw.fim.suffix)
    assert tokens == [ids["pre"], *prefix, ids["suf"], *suffix, ids["mid"]]  # Qwen adds no BOS


def test_control_token_text_in_code_stays_text(qwen):
    tokenizer, ids = qwen
    tokens = fim_tokens(tokenizer, ids, RawPrompt("s = '<|im_end|>'", fim=FillInMiddle("")), 4096, 16)
    assert tokenizer.token_id("<|im_end|>") not in tokens


def test_repository_fim_layout_and_cuts(qwen):
    tokenizer, ids = qwen
    fim = FillInMiddle(
        "\nprint(add(1, 2))\n",
        after_prefix="return",
        extra=(FileContext("util.py", "def sub(a, b):\n    return a - b\n"),),
        repository=True,
    )
    raw = RawPrompt("def add(a, b):\n    ", fim=fim)
    tokens = fim_tokens(tokenizer, ids, raw, 4096, 32)
    extra = [
        ids["rep"],
        *plain(tokenizer, "myproject\n"),
        ids["sep"],
        *plain(tokenizer, "util.py\n"),
        *plain(tokenizer, fim.extra[0].text),
        ids["sep"],
        *plain(tokenizer, "filename\n"),
    ]
    middle = tokenizer.encode("return")
    body = [
        ids["pre"],
        *plain(tokenizer, raw.text),
        *middle,
        ids["suf"],
        *plain(tokenizer, fim.suffix),
        ids["mid"],
    ]
    assert tokens == extra + body
    # A context that leaves no room beside llama.cpp's batch and two budgets drops the files.
    assert fim_tokens(tokenizer, ids, raw, FIM_BATCH + 60, 32) == body
    # The prefix keeps its last 1536 tokens, the suffix its first 512 - 2 - len(after_prefix).
    long = RawPrompt("x = 1\n" * 2000, fim=FillInMiddle("y = 2\n" * 1000, repository=True))
    cut = fim_tokens(tokenizer, ids, long, 8192, 32)
    pre, suf, mid = cut.index(ids["pre"]), cut.index(ids["suf"]), cut.index(ids["mid"])
    assert suf - pre - 1 == 3 * FIM_BATCH // 4 and mid - suf - 1 == FIM_BATCH // 4 - 2
    assert cut[pre + 1 : suf] == plain(tokenizer, long.text)[-(3 * FIM_BATCH // 4) :]


def test_a_vocabulary_without_fim_tokens_is_refused_naming_the_field():
    tokenizer, ids = vocabulary(default_model_path())
    error = fim_tokens(tokenizer, ids, RawPrompt("a", fim=FillInMiddle("b", param="input_suffix")), 1024, 8)
    assert isinstance(error, Error) and error.status == 400 and error.param == "input_suffix"
