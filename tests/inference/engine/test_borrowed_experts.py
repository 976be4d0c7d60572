"""``--experts=borrow``: routed experts read from the mapped file, converted only when picked,
give the same bits as experts repacked at load, on every synthetic MoE file."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from inference.engine.engine import Engine
from inference.engine.load_options import ExpertMode, LoadOptions
from inference.engine.models.experts import BorrowedExperts
from tests.fixtures.synthetic_gemma4 import gemma4_path
from tests.fixtures.synthetic_gguf import synthetic_path
from tests.fixtures.synthetic_inkling import inkling_path
from tests.fixtures.synthetic_qwen35 import qwen35_path

MOE_FILES = {
    "gemma4-moe": lambda d: gemma4_path("gemma4-moe", d),
    "qwen3moe": lambda d: synthetic_path("qwen3moe", d),
    "qwen35moe": lambda d: qwen35_path("qwen35moe", d),
    "inkling": lambda d: inkling_path("inkling", d),
}
BORROW = LoadOptions(experts=ExpertMode.BORROW)
TINY_CACHE = LoadOptions(experts=ExpertMode.BORROW, expert_cache=1)  # evicts on nearly every pick
DECODE_STEPS = 4


def borrowed_tensors(engine: Engine) -> list[BorrowedExperts]:
    """Every BorrowedExperts the model holds (the file keeps what still reads it)."""
    found = engine.file.borrowers
    assert all(isinstance(b, BorrowedExperts) for b in found)
    return found


def prompt_and_decode(engine: Engine, prompt: list[int]) -> list[np.ndarray]:
    """Every prompt position's logits, then the logits of a few greedy decode steps."""
    cache = engine.new_cache(64)
    logits = engine.model.forward(prompt, cache, all_logits=True)  # (n, vocab)
    out = [np.asarray(logits)]
    token = int(np.argmax(logits[-1]))
    for _ in range(DECODE_STEPS):
        step = engine.decode_one(cache, token)  # (vocab,)
        out.append(np.asarray(step))
        token = int(np.argmax(step))
    return out


@pytest.fixture(scope="module", params=list(MOE_FILES))
def moe_path(request, synthetic_dir):
    return MOE_FILES[request.param](synthetic_dir)


@pytest.mark.slow  # several seconds on a model: the slow tier (the fast one keeps under 5 minutes)
def test_borrowed_experts_give_the_bits_of_repacked_ones(moe_path):
    repacked, borrowed, tiny = (Engine.load(moe_path, o) for o in (None, BORROW, TINY_CACHE))
    prompt = list(np.random.default_rng(5).integers(3, repacked.config.vocab_size, 11))
    expected = prompt_and_decode(repacked, prompt)
    for engine in (borrowed, tiny):
        got = prompt_and_decode(engine, prompt)
        for want, have in zip(expected, got, strict=True):
            assert have.dtype == want.dtype and np.array_equal(have, want)
    assert not borrowed_tensors(repacked) and repacked.expert_mode == "repack"
    assert borrowed.expert_mode == "borrow"
    assert any(t.conversions > 1 for t in borrowed_tensors(tiny))  # evicted and converted again


def test_borrow_converts_only_the_experts_the_router_picks(moe_path):
    engine = Engine.load(moe_path, BORROW)
    tensors = borrowed_tensors(engine)
    assert tensors, "a MoE file must have borrowed experts"
    # Load converts one expert per tensor (to fail early on a bad tensor), nothing more.
    assert all(t.conversions == 1 and list(t.cache) == [0] for t in tensors)
    engine.decode_one(engine.new_cache(8), 5)
    k = engine.config.n_experts_used
    assert all(len(t) > k + 1 for t in tensors)  # so "not all of them" below means something
    for t in tensors:  # one token picks k experts per layer: at most k more conversions each
        assert 1 < t.conversions <= 1 + k and len(t.cache) == t.conversions


def test_borrowed_experts_index_like_a_list(synthetic_dir):
    engine = Engine.load(synthetic_path("qwen3moe", synthetic_dir), TINY_CACHE)
    experts = borrowed_tensors(engine)[0]
    repacked = Engine.load(synthetic_path("qwen3moe", synthetic_dir))
    assert len(experts) == len(repacked.model.layers[0]["ffn_gate_exps"])
    last = experts[np.int64(len(experts) - 1)]  # numpy ints (np.unique of the routes) index too
    assert last.rows == experts[0].rows and len(experts[1:3]) == 2
    with pytest.raises(IndexError, match="expert"):
        experts[len(experts)]


def test_a_model_without_experts_has_nothing_to_borrow(synthetic_dir, caplog):
    with caplog.at_level(logging.INFO, logger="inference.engine.engine"):
        engine = Engine.load(synthetic_path("llama", synthetic_dir), BORROW)
    assert engine.expert_mode is None and not borrowed_tensors(engine)
    assert "nothing to borrow" in caplog.text


def test_serving_bytes_count_the_mapped_experts_and_full_caches(moe_path):
    # What the KV RAM guard sets aside: every routed expert's bytes of the file (the gate and
    # up halves of a fused tensor add up to it) and each tensor's cache of converted experts.
    assert Engine.load(moe_path).serving_bytes == 0  # repacked: all held after the load
    engine = Engine.load(moe_path, BORROW)
    mapped = sum(t.data.nbytes for name, t in engine.file.tensors.items() if name.endswith("_exps.weight"))
    converted = sum(b.cache_size * b[0].nbytes for b in borrowed_tensors(engine))
    assert converted > 0 and engine.serving_bytes == mapped + converted
