"""Batched self-study synthesis is exact: conversations decoded together are the ones decoded
alone, and their targets are what a teacher-forced forward over the same tokens gives (a
synthetic model with random weights and the real SmolLM2 tokenizer)."""

from __future__ import annotations

import numpy as np
import pytest

from fleet.cartridges.build import corpus_tokens
from fleet.cartridges.replies import Reply
from fleet.cartridges.selfstudy import (
    SEED_OPENERS,
    SelfStudyConfig,
    excerpt_message,
    plan_conversation,
    question_ends,
    synthesize_batch,
)
from inference.engine.engine import Engine
from inference.engine.sampler import Sampler, SamplingParams
from inference.engine.training.distill import log_softmax, teacher_targets
from tests.fixtures.synthetic_gguf import synthetic_path

CORPUS = (
    "The ferry Aurelia leaves Port Vesk at 06:40 and reaches the salt flats of Omber by noon. "
    "Its captain, Tomas Reyl, logs every crossing in a blue ledger kept under the wheel. "
) * 3
CONFIG = SelfStudyConfig(span_min=40, span_max=56, max_question=8, max_answer=10, per_span=2)


@pytest.fixture(scope="module")
def engine(synthetic_dir):
    return Engine.load(synthetic_path("llama", synthetic_dir))


@pytest.fixture(scope="module")
def tokens(engine, tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(CORPUS)
    return corpus_tokens(engine, path)


def same(a, b) -> bool:
    return (a.question, a.prompt, a.answer, a.span, a.seed_type) == (
        b.question,
        b.prompt,
        b.answer,
        b.span,
        b.seed_type,
    ) and (np.array_equal(a.targets.ids, b.targets.ids) and np.array_equal(a.targets.probs, b.targets.probs))


def test_a_batch_decodes_what_each_conversation_decodes_alone(engine, tokens):
    plans = [plan_conversation(3, i, len(tokens), CONFIG) for i in range(6)]
    assert plans[0].span == plans[1].span and len({p.span for p in plans}) > 1  # shared prefills ran
    together = synthesize_batch(engine, tokens, plans, CONFIG)
    reversed_batch = synthesize_batch(engine, tokens, plans[::-1], CONFIG)[::-1]
    for plan, conv, other in zip(plans, together, reversed_batch, strict=True):
        alone = synthesize_batch(engine, tokens, [plan], CONFIG)[0]
        assert same(conv, alone) and same(conv, other), plan
    assert any(len(c.answer) == CONFIG.max_answer for c in together)  # the budget's extra row ran


def test_targets_are_the_teacher_forced_top_k(engine, tokens):
    plan = plan_conversation(3, 4, len(tokens), CONFIG)
    conv = synthesize_batch(engine, tokens, [plan], CONFIG)[0]
    question = {"role": "user", "content": conv.question}
    prompt = engine.encode_chat([excerpt_message(engine, tokens, plan.span), question])
    cache = engine.new_cache(len(prompt) + len(conv.answer) + 1)
    first = engine.prefill(cache, prompt)  # (vocab,)
    rest = engine.model.forward(list(conv.answer), cache, all_logits=True)  # (answer, vocab)
    logits = np.concatenate([first[None], rest]).astype(np.float32)  # (answer + 1, vocab)
    logp = log_softmax(logits)
    ids = np.argsort(-logp, axis=-1, kind="stable")[:, : CONFIG.top_k]  # the full-sort reference
    assert np.array_equal(conv.targets.ids, ids)
    want = teacher_targets(logits, CONFIG.top_k, CONFIG.top_mass)
    assert np.array_equal(conv.targets.probs, want.probs)
    assert list(conv.prompt) == engine.encode_chat([question])  # the student never sees the span


def test_partitioned_top_k_matches_a_full_sort():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(7, 3000)).astype(np.float32) * 4  # (rows, vocab)
    got = teacher_targets(logits, k=20, mass=0.99)
    logp = log_softmax(logits)
    ids = np.argsort(-logp, axis=-1, kind="stable")[:, :20]  # (rows, 20)
    probs = np.exp(np.take_along_axis(logp, ids, axis=-1))
    before = np.cumsum(probs, axis=-1) - probs
    assert np.array_equal(got.ids, ids)
    assert np.allclose(got.probs, np.where(before < 0.99, probs, 0.0), rtol=0, atol=1e-7)
    assert np.array_equal(teacher_targets(logits[:, :5], k=20).ids.shape, (7, 5))  # k clipped to vocab


def test_bot_a_continues_the_opener_its_plan_chose(engine, tokens):
    plans = [plan_conversation(3, i, len(tokens), CONFIG) for i in range(12)]
    assert len({p.opener for p in plans}) > 3  # openers vary with the seed
    for plan, conv in zip(plans, synthesize_batch(engine, tokens, plans, CONFIG), strict=True):
        assert plan.opener in SEED_OPENERS[plan.seed_type]
        assert conv.question.startswith(plan.opener)


def test_a_question_ends_at_its_first_question_mark_or_line_break(engine):
    ends = question_ends(engine.tokenizer)
    for text in ("?", "?\n", "\n", " there?"):
        assert engine.tokenizer.encode(text, add_bos=False)[-1] in ends, text
    assert not {engine.tokenizer.encode(w, add_bos=False)[0] for w in ("What", " lantern", ".")} & ends
    vocab = engine.tokenizer.vocab_size
    mark = next(iter(ends))
    logits = np.zeros(vocab, np.float32)
    logits[mark] = 10.0  # greedy picks an end token
    reply = Reply(None, logits, Sampler(SamplingParams()), [], budget=8, end_ids=ends)
    assert reply.take(engine.stop_ids) is False  # nothing more to run
    assert reply.tokens == [mark] and reply.done  # the end token is kept
