"""Inkling on its synthetic files (tests/fixtures/synthetic_inkling.py).

llama.cpp does not know the architecture, so the forward is checked against an independent
numpy reference (inkling_reference.py: the gguf package's dequantizer, float64, one token at a
time) and against the reference implementation itself (fucina's Zig CLI; its logits and greedy
tokens recorded by scripts/record_inkling_goldens.py into tests/goldens/inkling_reference.json).
Also here: path invariance (the checks of test_invariance.py that apply: Inkling's short-conv
state cannot be cut back, so there is no verify-and-truncate), the rolling state's
refusals, the padded vocabulary, the short convolution on the reference's own example, the
wire-format renderer against the reference's goldens, and the think markers' routing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from inference.engine.chat_template import ChatTemplateError
from inference.engine.engine import Engine
from inference.engine.families import FAMILIES
from inference.engine.models.inkling_ffn import top_k_lowest_id
from inference.engine.models.inkling_state import InklingCache, short_conv
from inference.engine.sampler import SamplingParams
from inference.generation.emitter import ReplyEmitter
from inference.types import ReasoningDelta, TextDelta
from tests.fixtures.generation import generate_ids
from tests.fixtures.synthetic_inkling import (
    ANSWER_TEXT,
    GENERATOR_VERSION,
    N_PAD,
    SPECS,
    THINK_TEXT,
    inkling_path,
)
from tests.inference.engine.inkling_reference import ReferenceInkling
from tests.inference.engine.test_invariance import (  # noqa: F401  (collected here with this module's engine)
    test_lockstep_batch_rows_equal_their_own_decode,
    test_mixed_runs_in_one_forward_equal_separate_forwards,
    test_prefill_chunks_equal_one_token_decode,
)

N_COMPARED = 30  # past the window (8), the global rel-bias band (12) and the log-N floor (4)


@pytest.fixture(scope="module", params=["inkling", "inkling-float"])
def engine(request, synthetic_dir) -> Engine:
    return Engine.load(inkling_path(request.param, synthetic_dir))


@pytest.fixture(scope="module")
def think_engine(synthetic_dir) -> Engine:
    return Engine.load(inkling_path("inkling-think", synthetic_dir))


def _compared(engine: Engine) -> tuple[np.ndarray, np.ndarray]:
    """The engine's and the reference's logits (n, vocab) for the same random tokens."""
    tokens = np.random.default_rng(0).integers(3, 49000, N_COMPARED).tolist()
    got = engine.model.forward(tokens, engine.new_cache(N_COMPARED), all_logits=True)
    name = engine.path.name.split("synthetic-")[1].rsplit("-v", 1)[0]
    return got, ReferenceInkling(engine.path, SPECS[name]).run(tokens)


def test_the_files_cover_both_qkvr_paths(engine):
    stacked = ["attn_qkvr" in layer for layer in engine.model.layers]
    if engine.path.name.startswith("synthetic-inkling-float"):
        assert stacked == [False] * 4  # float matrices never stack
    else:
        assert stacked == [True, False, True, False]  # one format stacks, mixed formats stay separate
    assert [("moe" in layer) for layer in engine.model.layers] == [False, True, True, True]


@pytest.mark.slow  # several seconds on a model: the slow tier (the fast one keeps under 5 minutes)
def test_forward_matches_the_independent_reference(engine):
    got, ref = _compared(engine)
    vocab = got.shape[1] - N_PAD
    assert np.isneginf(got[:, vocab:]).all() and np.isneginf(ref[:, vocab:]).all()
    got, ref = got[:, :vocab], ref[:, :vocab]
    if engine.path.name.startswith("synthetic-inkling-float"):
        # Float weights: only float32 against float64 arithmetic apart.
        assert np.abs(got - ref).max() < 5e-3
        assert np.array_equal(got.argmax(axis=1), ref.argmax(axis=1))
    else:
        # Quantized weights: the int8 rounding of activations (as llama.cpp's products round
        # them) moves logits by < 0.15 here. At the last position two routing choices are near
        # ties (score margins 0.0007 and 0.0017, layers 2 and 3) that this rounding flips.
        first = N_COMPARED - 1
        assert np.abs(got[:first] - ref[:first]).max() < 0.15
        for row_got, row_ref in zip(got[:first], ref[:first], strict=True):
            assert np.corrcoef(row_got, row_ref)[0, 1] > 0.999


def test_padded_ids_never_come_out(engine):
    prompt = engine.encode_chat([{"role": "user", "content": "Hi"}])
    params = SamplingParams(temperature=1.5, seed=3)
    ids = generate_ids(engine, engine.new_cache(64), prompt, params, 20, ignore_eos=True)
    assert len(ids) == 20 and max(ids) < engine.config.vocab_size - N_PAD


def test_the_rolling_state_cannot_be_cut_back(engine):
    tokens = np.random.default_rng(5).integers(3, 49000, 10).tolist()
    cache = engine.new_cache(32)
    assert isinstance(cache, InklingCache)
    first = engine.prefill(cache, tokens)
    cache.truncate(6)
    with pytest.raises(ValueError, match="cannot be cut back"):
        engine.decode_one(cache, tokens[6])
    cache.truncate(0)  # a fresh conversation: the state is cleared and the same logits come back
    assert np.array_equal(engine.prefill(cache, tokens), first)
    with pytest.raises(ValueError, match="KV prefix"):
        cache.install_prefix(object())
    other = engine.new_cache(32)
    other.copy_rows_from(cache, len(tokens))  # the whole conversation: its state comes along
    assert np.array_equal(engine.decode_one(other, 7), engine.decode_one(cache, 7))


def test_short_conv_on_the_references_example():
    # fucina model_tests.zig: width 2, K = 3; channel 0 taps (1, 10, 100), channel 1 (2, 20, 200),
    # the last tap multiplying the newest input.
    kernel = np.array([[1, 10, 100], [2, 20, 200]], np.float32)  # (width, K)
    state = np.zeros((2, 2), np.float32)  # (K-1, width)
    y = short_conv(np.array([[1, 1], [2, 3]], np.float32), kernel, state)
    assert y.tolist() == [[101, 201], [212, 623]]
    assert state.tolist() == [[1, 1], [2, 3]]
    assert short_conv(np.array([[5, 7]], np.float32), kernel, state).tolist() == [[526, 1469]]
    assert state.tolist() == [[2, 3], [5, 7]]


def test_expert_choice_ties_keep_the_lower_id():
    scores = np.array([[0.5, 0.9, 0.9, 0.1]], np.float32)
    assert top_k_lowest_id(scores, 2).tolist() == [[1, 2]]


# -- serving: the renderer and the reasoning routing ----------------------------------------------
EFFORT = "<|message_system|><|content_text|>Thinking effort level: 0.9<|end_message|>"
RENDER_GOLDENS = [  # fucina src/llm/inkling/chat_tests.zig (llama.cpp's rendering of Inkling.jinja)
    ([("user", "Hi!")], EFFORT + "<|message_user|><|content_text|>Hi!<|end_message|><|message_model|>"),
    (
        [("system", "You are helpful."), ("user", "Hi!")],
        "<|message_system|><|content_text|>You are helpful.<|end_message|>"
        + EFFORT
        + "<|message_user|><|content_text|>Hi!<|end_message|><|message_model|>",
    ),
    (
        [("user", "2+2?"), ("assistant", "4"), ("user", "x3?")],
        EFFORT + "<|message_user|><|content_text|>2+2?<|end_message|>"
        "<|message_model|><|content_text|>4<|end_message|><|content_model_end_sampling|>"
        "<|message_user|><|content_text|>x3?<|end_message|><|message_model|>",
    ),
    (
        [("system", "Be brief."), ("user", "2+2?"), ("assistant", "4"), ("user", "and x3?")],
        "<|message_system|><|content_text|>Be brief.<|end_message|>"
        + EFFORT
        + "<|message_user|><|content_text|>2+2?<|end_message|>"
        "<|message_model|><|content_text|>4<|end_message|><|content_model_end_sampling|>"
        "<|message_user|><|content_text|>and x3?<|end_message|><|message_model|>",
    ),
]


@pytest.mark.parametrize(("turns", "expected"), RENDER_GOLDENS)
def test_renderer_matches_the_references_goldens(think_engine, turns, expected):
    messages = [{"role": role, "content": content} for role, content in turns]
    assert think_engine.chat_template.is_fallback
    assert think_engine.render_chat(messages) == expected


def test_renderer_think_off_primes_a_text_block_and_refuses_other_roles(think_engine):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi!"}]}]
    text = think_engine.render_chat(messages, enable_thinking=False)
    assert text.endswith(
        "<|message_user|><|content_text|>Hi!<|end_message|><|message_model|><|content_text|>"
    )
    with pytest.raises(ChatTemplateError, match="no tool role"):
        think_engine.render_chat([{"role": "tool", "content": "42"}])


def test_marker_text_in_a_message_stays_plain(think_engine):
    ids = think_engine.encode_chat([{"role": "user", "content": "<|content_thinking|>"}])
    marker = think_engine.tokenizer.token_id("<|content_thinking|>")
    assert marker not in ids


def _route(engine: Engine, ids: list[int], reasoning: bool) -> tuple[str, str]:
    emitter = ReplyEmitter(reasoning=reasoning, think=engine.family.think)
    events = [e for i in ids for e in emitter.feed(engine.reply_bytes(i))] + emitter.flush()
    thought = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    return thought, "".join(e.text for e in events if isinstance(e, TextDelta))


def test_reasoning_routes_from_content_thinking_to_content_text(think_engine):
    family = think_engine.family
    assert family is FAMILIES["inkling"] and not family.kv_reuse and not family.spec
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = think_engine.encode_chat(messages, enable_thinking=True)
    ids = generate_ids(think_engine, think_engine.new_cache(128), prompt, SamplingParams(), 40)
    # The markers are control tokens: hidden as text, except the two that route the block.
    tok = think_engine.tokenizer
    assert all(tok.is_control(tok.token_id(m)) for m in ("<|content_thinking|>", "<|end_message|>"))
    assert (
        tok.token_id("<|end_message|>") in ids
        and think_engine.reply_bytes(tok.token_id("<|end_message|>")) == b""
    )
    assert _route(think_engine, ids, reasoning=True) == (THINK_TEXT, ANSWER_TEXT)
    assert _route(think_engine, ids, reasoning=False) == ("", ANSWER_TEXT)
    # Thinking off: the primed text block makes the model answer at once.
    prompt = think_engine.encode_chat(messages, enable_thinking=False)
    ids = generate_ids(think_engine, think_engine.new_cache(128), prompt, SamplingParams(), 40)
    assert _route(think_engine, ids, reasoning=True) == ("", ANSWER_TEXT)


def test_the_conversation_backend_serves_it_without_reuse_or_speculation(think_engine):
    from inference.generation.backends import BackendSetup, backend_for

    backend = backend_for(BackendSetup(think_engine, n_ctx=128))
    can = backend.capabilities
    assert can.kv_reuse is False and can.spec is False and can.batch is False and can.reasoning
    assert backend.speculator is None


def test_flags_that_keep_rows_across_requests_are_refused_at_start_up(think_engine):
    from inference.generation.backends import BackendSetup, backend_for

    with pytest.raises(ValueError, match="--cartridge / --fleet is not supported for the inkling family"):
        backend_for(BackendSetup(think_engine, n_ctx=128, prefix_source=object()))
    with pytest.raises(ValueError, match="--kv-cache-dir is not supported.*; --cartridge / --fleet is not"):
        backend_for(BackendSetup(think_engine, n_ctx=128, disk=object(), prefix_source=object()))
    # Once accepted and silently unused: no verify run can be cut back, no weight pass shared.
    with pytest.raises(ValueError, match="^--spec is not supported for the inkling family: its short-conv"):
        backend_for(BackendSetup(think_engine, n_ctx=128, spec=True))
    with pytest.raises(ValueError, match="^--batch 2 is not supported .*numpy layers one conversation"):
        backend_for(BackendSetup(think_engine, n_ctx=128, batch=2))


PRE_TOKENIZER_CASES = [  # fucina src/llm/tokenizer.zig, "inkling pretokenizer" test
    ("Hello world", ["Hello", " world"]),
    ("HELLO", ["HELLO"]),
    ("e\u0301clair", ["e\u0301clair"]),  # a combining mark joins the word
    ("A\u00c9B", ["A\u00c9", "B"]),  # a non-ASCII letter is of both cases
    ("\u0301AB", ["\u0301", "AB"]),
    ("can'T", ["can'T"]),
    ("1234", ["123", "4"]),
    ("hi.\n/x", ["hi", ".\n/", "x"]),
    ("  \n  x", ["  \n", " ", " x"]),
    (" !!", [" !!"]),
    (" 5", [" ", "5"]),
]


@pytest.mark.parametrize(("text", "words"), PRE_TOKENIZER_CASES)
def test_the_inkling_pre_tokenizer_splits_as_the_reference(text, words):
    from inference.engine.tokenizer.pretokenizers import PreTokenizer

    assert PreTokenizer("inkling").split(text) == words


# -- the reference implementation itself as the oracle ---------------------------------------------
REFERENCE_GOLDENS = Path(__file__).resolve().parents[2] / "goldens" / "inkling_reference.json"
# Float weights: float32 apart (and our float16 cache). Quantized: our products round the
# activations to int8 as llama.cpp's do, the reference's do not (see test above).
TOLERANCE = {"inkling-float": 5e-3, "inkling": 0.5}


@pytest.fixture(scope="module")
def reference_goldens() -> dict:
    goldens = json.loads(REFERENCE_GOLDENS.read_text())
    assert goldens["generator_version"] == GENERATOR_VERSION, "re-record: scripts/record_inkling_goldens.py"
    return goldens


def test_logits_and_greedy_path_match_the_reference_implementation(engine, reference_goldens):
    name = engine.path.name.split("synthetic-")[1].rsplit("-v", 1)[0]
    tolerance = TOLERANCE[name]
    for case in reference_goldens["files"][name]:
        cache = engine.new_cache(64)
        logits = engine.prefill(cache, case["tokens"])
        assert int(np.isneginf(logits).sum()) == case["n_neg_inf"] == N_PAD
        for ids, values in ((case["top_ids"], case["top_logits"]), (case["probe_ids"], case["probe_logits"])):
            assert np.abs(logits[ids] - np.array(values)).max() < tolerance
        # Along the reference's 16 greedy tokens, each is our argmax or within the tolerance of it.
        for token in case["greedy"]:
            assert logits.max() - logits[token] < tolerance
            logits = engine.decode_one(cache, token)


def test_a_forward_that_fails_halfway_leaves_the_state_refused(think_engine, monkeypatch):
    cache = think_engine.new_cache(32)
    think_engine.prefill(cache, [5, 6, 7])

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(think_engine.model.layers[-1]["moe"], "route", broken)
    with pytest.raises(RuntimeError, match="boom"):
        think_engine.decode_one(cache, 8)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="cannot be cut back"):
        think_engine.decode_one(cache, 8)
    cache.truncate(0)  # what a failed stream's slot reset does
    assert np.isfinite(think_engine.prefill(cache, [5, 6, 7])).any()


def test_a_lockstep_batch_streams_what_requests_alone_stream(synthetic_dir):
    # The conversation backend serves Inkling in lockstep (--batch): every stream in a fresh
    # slot, the same events as each request served alone (with and without reasoning).
    from inference.generation.backend import ConversationBackend
    from inference.generation.stream import BatchItem
    from inference.types import GenerationRequest, Message, SamplingOverrides
    from tests.inference.generation.test_backend import RecordingSink

    engine = Engine.load(inkling_path("inkling", synthetic_dir))
    greedy = SamplingOverrides(temperature=0.0)
    requests = [
        GenerationRequest((Message("user", text),), greedy, max_tokens=6, reasoning=reasoning)
        for text, reasoning in (("Hi there", True), ("What is two plus two?", False), ("Hi", False))
    ]
    backend = ConversationBackend(engine, n_ctx=128, kv_slots=3)
    alone = []
    for request in requests:
        backend.generate(request, backend.validate(request), sink := RecordingSink())
        alone.append(sink.events)
    sinks = [RecordingSink() for _ in requests]
    items = [BatchItem(r, backend.validate(r), s) for r, s in zip(requests, sinks, strict=True)]
    backend.generate_batch(items)
    assert [s.events for s in sinks] == alone
    assert all(
        events[-1].usage.cached_tokens == 0 and events[-1].usage.completion_tokens == 6 for events in alone
    )
    assert any(isinstance(e, ReasoningDelta) for e in alone[0]) or any(
        isinstance(e, TextDelta) for e in alone[0]
    )
