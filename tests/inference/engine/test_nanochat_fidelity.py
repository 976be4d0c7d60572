"""nanochat against the reference implementation itself: the greedy replies its own chat CLI
(fucina examples/nanochat, Zig) gave on the synthetic checkpoint, recorded by
scripts/record_nanochat_goldens.py, are ours byte for byte. The same prompt protocol, the same
tokenizer (digits, unicode, contractions, whitespace runs) and the same forward, including a
prompt past the 513-key attention window."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from inference.engine.nanochat_checkpoint import load_checkpoint
from tests.fixtures.synthetic_nanochat import write_nanochat_checkpoint

GOLDENS = json.loads((Path(__file__).parents[2] / "goldens" / "nanochat_synthetic_zig.json").read_text())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return load_checkpoint(write_nanochat_checkpoint(tmp_path_factory.mktemp("nano-fidelity") / "ck"))


def greedy_reply(checkpoint, prompt: str, max_tokens: int) -> bytes:
    """nanochat's chat protocol for one user turn, argmax decoding to a terminal token."""
    tok, model = checkpoint.tokenizer, checkpoint.model
    s = tok.special_id
    ids = [
        s("<|bos|>"),
        s("<|user_start|>"),
        *tok.encode(prompt),
        s("<|user_end|>"),
        s("<|assistant_start|>"),
    ]
    cache = model.new_cache(len(ids) + max_tokens)
    logits, reply = model.forward(cache, ids)[-1], []
    for _ in range(max_tokens):
        token = int(np.argmax(logits))
        if token in (s("<|bos|>"), s("<|assistant_end|>")):
            break
        reply.append(token)
        logits = model.forward(cache, [token])[-1]
    return tok.decode(reply)


@pytest.mark.parametrize("case", GOLDENS["cases"], ids=lambda c: c["prompt"][:24])
def test_greedy_reply_is_the_references(checkpoint, case):
    assert greedy_reply(checkpoint, case["prompt"], GOLDENS["max_tokens"]).hex() == case["reply_hex"]


def test_the_long_prompt_passes_the_window(checkpoint):
    longest = max(GOLDENS["cases"], key=lambda c: len(c["prompt"]))
    assert len(checkpoint.tokenizer.encode(longest["prompt"])) > checkpoint.model.config.window
