"""The speculative acceptance rule: the same tokens and the same cache as plain decoding.

Drafts come from scripted sources that know the plain reply: a perfect one (every draft
accepted), a garbage one (every draft rejected) and one that is right for a while and then
wrong, so every branch of the rule runs (acceptance, correction, bonus token, truncation).
The verify costs are set so the gate never pauses: every draft is verified. Greedy and
sampled (penalties, top-k/p, min-p, a seed), on synthetic models of two families.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pytest

from inference.engine.engine import Engine
from inference.engine.sampler import SamplingParams
from inference.generation.constraints import ConstraintCompiler, ConstraintSpec
from inference.generation.drafts import Draft, RecyclingTable, VerifyCosts
from inference.generation.speculative import Speculator
from inference.generation.tokens import TokenGenerator
from tests.fixtures.generation import generate_ids, generator
from tests.fixtures.synthetic_gguf import synthetic_path

FREE = VerifyCosts((1, 16), (1.0, 1.0))  # verifying is free: the gate always opens
GREEDY = SamplingParams()
SAMPLED = SamplingParams(
    temperature=0.9, top_k=30, top_p=0.95, min_p=0.02, repeat_penalty=1.3, frequency_penalty=0.4, seed=11
)
MODES = ("perfect", "garbage", "half")


class ScriptedSource:
    """Drafts what the plain run produced next ("perfect"), something else ("garbage"), or
    the truth for two tokens and then a wrong one ("half"). ``history``: the prompt and the
    tokens committed before drafting starts; ``script`` follows the prompt's ``start`` tokens."""

    def __init__(self, start: int, history: Sequence[int], script: list[int], mode: str, vocab: int):
        self.start = start
        self.stream = list(history)
        self.script = script
        self.mode = mode
        self.vocab = vocab
        self.committed = 0

    def observe(self, token: int) -> None:
        self.stream.append(token)
        self.committed += 1

    def propose(self, budget: int) -> tuple[Draft, float]:
        truth = self.script[len(self.stream) - self.start :][:budget]
        if self.mode == "garbage":
            truth = [(t + 17) % self.vocab for t in truth]
        elif self.mode == "half":
            truth = truth[:2] + [(t + 17) % self.vocab for t in truth[2:]]
        return Draft(truth, None), 0.99


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def engine(request, synthetic_dir) -> Engine:
    return Engine.load(synthetic_path(request.param, synthetic_dir))


def prompt_of(engine: Engine) -> list[int]:
    return engine.encode_prompt("one two three four five six seven eight one two three four")


def plain_run(engine, prompt, params, max_tokens, n_ctx=256, **kwargs):
    cache = engine.new_cache(n_ctx)
    return generate_ids(engine, cache, prompt, params, max_tokens, **kwargs), cache


def scripted(engine, prompt, script, mode) -> Speculator:
    """A speculator whose every request drafts from ``script`` in ``mode``."""

    def sources(history, _recycling):
        return ScriptedSource(len(prompt), history, script, mode, engine.config.vocab_size)

    return Speculator(engine, FREE, sources=sources)


def spec_run(engine, prompt, params, max_tokens, script, mode, n_ctx=256, **kwargs):
    cache = engine.new_cache(n_ctx)
    loop = TokenGenerator(engine, scripted(engine, prompt, script, mode))
    run = loop.run(cache, prompt, params, max_tokens, **kwargs)
    return run.tokens, cache, run.stats


def assert_same_cache(plain, spec):
    n = plain.n_tokens
    assert spec.tokens == plain.tokens
    assert np.array_equal(spec.k[:, :, :n], plain.k[:, :, :n]) and np.array_equal(
        spec.v[:, :, :n], plain.v[:, :, :n]
    )


@pytest.mark.slow  # several seconds on a model: the slow tier (the fast one keeps under 5 minutes)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_any_source_commits_the_plain_tokens_and_leaves_the_plain_cache(engine, params, mode):
    prompt = prompt_of(engine)
    plain, plain_cache = plain_run(engine, prompt, params, 40, ignore_eos=True)
    spec, spec_cache, stats = spec_run(engine, prompt, params, 40, plain, mode, ignore_eos=True)
    assert spec == plain
    assert_same_cache(plain_cache, spec_cache)
    assert stats.generated_tokens == 40 and stats.decoded_tokens == plain_cache.n_tokens - len(prompt)
    if mode == "perfect":  # many tokens per forward: speculation really ran
        assert stats.spec_accepted == stats.spec_drafted > 20 and stats.decode_forwards < 10
    if mode == "garbage":
        assert stats.spec_drafted > 0 and stats.spec_accepted == 0


def test_penalties_see_the_accepted_tokens_of_the_same_verify(engine):
    # A strong repeat penalty on a perfect source: each row's sample depends on the tokens
    # accepted earlier in the same verify; a stale history would pick differently.
    params = SamplingParams(repeat_penalty=3.0, repeat_last_n=8)
    prompt = prompt_of(engine)
    plain, _ = plain_run(engine, prompt, params, 30, ignore_eos=True)
    stale, _ = plain_run(engine, prompt, SamplingParams(), 30, ignore_eos=True)
    assert plain != stale  # the penalty matters for this prompt
    spec, _, stats = spec_run(engine, prompt, params, 30, plain, "perfect", ignore_eos=True)
    assert spec == plain and stats.spec_accepted > 10


@pytest.mark.parametrize("mode", ["perfect", "half"])
def test_stopping_mid_verify_cuts_the_cache_where_the_plain_loop_stops(engine, mode):
    # The caller stops after 13 tokens (a client hung up): drafted rows after it are dropped.
    prompt = prompt_of(engine)
    script, _ = plain_run(engine, prompt, GREEDY, 40, ignore_eos=True)
    caches = []
    for loop in (generator(engine), TokenGenerator(engine, scripted(engine, prompt, script, mode))):
        cache = engine.new_cache(256)
        run = loop.run(cache, prompt, GREEDY, 40, ignore_eos=True, stop_after=13)
        assert run.tokens == script[:13] and run.final is None
        caches.append(cache)
    assert_same_cache(*caches)


@pytest.mark.parametrize("n_ctx,max_tokens", [(40, 64), (256, 7)])
def test_a_full_context_or_the_token_budget_ends_the_reply_at_the_same_token(engine, n_ctx, max_tokens):
    prompt = prompt_of(engine)
    plain, plain_cache = plain_run(engine, prompt, GREEDY, max_tokens, n_ctx=n_ctx, ignore_eos=True)
    spec, spec_cache, _ = spec_run(
        engine, prompt, GREEDY, max_tokens, plain, "perfect", n_ctx=n_ctx, ignore_eos=True
    )
    assert spec == plain and len(plain) == min(max_tokens, n_ctx - len(prompt) + 1)
    assert_same_cache(plain_cache, spec_cache)


def test_end_of_generation_ends_the_reply_and_keeps_its_row_out(engine):
    # Without ignore_eos the synthetic model may stop at any point; make it stop by
    # declaring the plain run's 9th token an end-of-generation token.
    prompt = prompt_of(engine)
    free, _ = plain_run(engine, prompt, GREEDY, 30, ignore_eos=True)
    stop = free[8]
    engine.stop_ids, saved = engine.stop_ids | {stop}, engine.stop_ids
    try:
        plain, plain_cache = plain_run(engine, prompt, GREEDY, 30)
        spec, spec_cache, _ = spec_run(engine, prompt, GREEDY, 30, free, "perfect")
    finally:
        engine.stop_ids = saved
    assert spec == plain == free[: free.index(stop)]
    assert_same_cache(plain_cache, spec_cache)


def test_grammar_masks_every_row_and_drafts_are_cut_to_what_it_allows(synthetic_dir):
    engine = Engine.load(synthetic_path("llama", synthetic_dir))
    compiler = ConstraintCompiler(engine.tokenizer, stop_ids=engine.stop_ids)
    spec = ConstraintSpec("regex", "[a-z]+( [a-z]+){5,12}\\.", "regex")
    prompt = prompt_of(engine)
    plain, plain_cache = plain_run(engine, prompt, GREEDY, 60, constraint=spec)
    assert plain and re.fullmatch(r"[a-z ]+\.?", engine.tokenizer.decode(plain))
    # A "garbage" script is mostly outside the grammar: valid_prefix cuts it before verifying.
    for mode in ("perfect", "garbage"):
        got, cache, stats = spec_run(engine, prompt, GREEDY, 60, plain, mode, constraint=spec)
        assert got == plain
        assert_same_cache(plain_cache, cache)
    constraint = compiler.constraint(spec)
    assert constraint.valid_prefix(plain) == len(plain)
    assert constraint.valid_prefix([engine.tokenizer.encode("A", add_bos=False)[0]]) == 0


def test_recycling_and_conversation_drafts_on_a_repeating_stream(engine):
    # The default sources on a model that repeats itself: the automaton drafts its loop.
    prompt = prompt_of(engine)
    plain, plain_cache = plain_run(engine, prompt, GREEDY, 80, ignore_eos=True)
    cache, speculator = engine.new_cache(256), Speculator(engine, FREE)
    run = TokenGenerator(engine, speculator).run(cache, prompt, GREEDY, 80, ignore_eos=True)
    spec, stats = run.tokens, run.stats
    assert spec == plain
    assert_same_cache(plain_cache, cache)
    assert stats.spec_drafted > 0
    assert isinstance(speculator.recycling, RecyclingTable) and (speculator.recycling.next >= 0).any()


@pytest.fixture(scope="module")
def backends():
    """A plain and a speculative backend over the default model (verifying free: the gate
    verifies every draft the conversation offers)."""
    from inference.generation.backend import ConversationBackend
    from tests.fixtures.model_files import default_model_path

    engine = Engine.load(default_model_path())
    spec = ConversationBackend(engine, n_ctx=512, kv_slots=1, spec=True)
    spec.speculator.costs = FREE
    return ConversationBackend(engine, n_ctx=512, kv_slots=1), spec


@pytest.mark.parametrize(
    "stop,cancel_after",
    [((), None), (("grape",), None), (("ig, gr",), None), ((), 5)],
    ids=["plain", "stop-word", "stop-inside-tokens", "cancelled"],
)
def test_backend_events_and_slot_equal_plain_with_stops_and_cancellation(backends, stop, cancel_after):
    from inference.types import GenerationRequest, Message, SamplingOverrides, TextDelta

    from .test_backend import RecordingSink, run

    fruits = "apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango"
    ask = f"Repeat this list exactly: {fruits}."
    request = GenerationRequest((Message("user", ask),), SamplingOverrides(temperature=0.0), 40, stop=stop)
    outcomes = []
    for backend in backends:
        sink, generated = run(backend, request, RecordingSink(cancel_after))
        outcomes.append((sink.events, generated, list(backend.slots.slots[0].cache.tokens)))
        backend.release()
    assert outcomes[1] == outcomes[0]  # events (text, finish, usage), token count, slot shadow
    text = "".join(e.text for e in outcomes[0][0] if isinstance(e, TextDelta))
    assert "apple" in text and not any(s in text for s in stop)
