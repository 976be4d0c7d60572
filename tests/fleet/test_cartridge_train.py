"""Self-study synthesis, cartridge training and build_cartridge with steps > 0, on a synthetic
model (random weights, the real SmolLM2 tokenizer)."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest

from fleet.cartridges.build import BuildCancelled, CartridgeBuildSpec, build_cartridge, corpus_tokens
from fleet.cartridges.dataset import DatasetHeader, load_split, write_shard
from fleet.cartridges.file import load_cartridge
from fleet.cartridges.init import initial_cartridge
from fleet.cartridges.selfstudy import SelfStudyConfig, synthesize_many
from fleet.cartridges.train import ConversationPool, TrainConfig, held_out_pool, mean_loss, train_cartridge
from inference.engine.engine import Engine
from inference.engine.training import PrefixForward
from tests.fixtures.synthetic_gguf import synthetic_path

CORPUS = (
    "The lighthouse keeper Ilse Varga rows to Skerrow Island every Tuesday with 14 crates of lamp oil. "
    "Her boat, the Marrow Gull, is painted green and has a red sail sewn in 1987. "
) * 2
SMALL = SelfStudyConfig(span_min=48, span_max=48, max_question=8, max_answer=12)


@pytest.fixture(scope="module")
def engine(synthetic_dir):
    return Engine.load(synthetic_path("llama", synthetic_dir))


@pytest.fixture(scope="module")
def corpus(engine, tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(CORPUS)
    return path


def test_self_study_is_deterministic_and_supervises_the_answer(engine, corpus):
    tokens = corpus_tokens(engine, corpus)
    first, again = (synthesize_many(engine, tokens, seed=5, count=2, config=SMALL) for _ in range(2))
    for a, b in zip(first, again, strict=True):
        assert (a.question, a.prompt, a.answer, a.span) == (b.question, b.prompt, b.answer, b.span)
        assert np.array_equal(a.targets.ids, b.targets.ids) and np.array_equal(
            a.targets.probs, b.targets.probs
        )
    conv = first[0]
    assert conv.span[1] - conv.span[0] == 48
    assert conv.targets.rows == len(conv.answer) + 1 == len(conv.head_rows)
    assert conv.head_rows[0] == len(conv.prompt) - 1 and conv.tokens[: len(conv.prompt)] == list(conv.prompt)
    mass = conv.targets.probs.sum(axis=1)
    assert np.all(mass <= 1.0 + 1e-5) and np.all(mass > 0) and conv.targets.ids.shape[1] == 20
    span_text = engine.tokenizer.decode(tokens[conv.span[0] : conv.span[1]])
    assert span_text.strip()[:40] not in engine.tokenizer.decode(
        list(conv.prompt)
    )  # the student never sees it
    assert synthesize_many(engine, tokens, seed=6, count=1, config=SMALL)[0].question != first[0].question


def test_training_lowers_the_held_out_loss_and_keeps_the_sink(engine, corpus):
    tokens = corpus_tokens(engine, corpus)
    start = initial_cartridge(engine, tokens[:8], frozen_rows=1)
    config = TrainConfig(steps=6, lr=2e-2, accum=2, held_out=2, seed=1, selfstudy=SMALL)
    seen = []
    result = train_cartridge(engine, start, tokens, config, on_step=lambda *a: seen.append(a))
    assert [s[:2] for s in seen] == [(i, 6) for i in range(1, 7)]
    assert result.history == [s[2] for s in seen]
    assert result.loss_last < result.loss_first - 0.01, (result.loss_first, result.loss_last)
    trained = result.cartridge
    assert np.array_equal(trained.k[:, :, :1], start.k[:, :, :1]) and np.array_equal(
        trained.v[:, :, :1], start.v[:, :, :1]
    )
    assert not np.array_equal(trained.k[:, :, 1:], start.k[:, :, 1:])
    assert trained.training["steps"] == 6 and trained.training["loss_last"] == result.loss_last


class Recorder:
    def __init__(self, cancel_after: int | None = None):
        self.steps, self.logs, self.cancel_after = [], [], cancel_after
        self.conversations, self.held_out = [], []

    def on_step(self, step, total, loss):
        self.steps.append((step, total, loss))

    def on_conversations(self, count, coverage):
        self.conversations.append((count, coverage))

    def on_held_out(self, step, loss):
        self.held_out.append((step, loss))

    def on_log(self, message):
        self.logs.append(message)

    def cancelled(self):
        return self.cancel_after is not None and len(self.steps) >= self.cancel_after


def test_build_cartridge_trains_and_round_trips(engine, corpus, tmp_path):
    out = tmp_path / "c.safetensors"
    spec = CartridgeBuildSpec(
        corpus, out, engine.path, prefix_tokens=8, steps=2, lr=1e-2, accum=1, selfstudy=SMALL
    )
    progress = Recorder()
    result = build_cartridge(spec, progress, engine)
    assert [s[:2] for s in progress.steps] == [(1, 2), (2, 2)] and all(
        np.isfinite(s[2]) for s in progress.steps
    )
    assert (
        result.steps == 2
        and result.rows == 8
        and result.loss_first is not None
        and result.loss_last is not None
    )
    loaded = load_cartridge(out)
    assert loaded.training["loss_first"] == result.loss_first and loaded.training["method"] == "self-study"
    assert loaded.frozen_rows == 1 and loaded.fingerprint == engine.fingerprint
    init = initial_cartridge(engine, corpus_tokens(engine, corpus)[:8])
    assert not np.array_equal(loaded.k, init.k)  # trained rows, not the initialisation


def test_build_cartridge_cancelled_mid_training_writes_nothing(engine, corpus, tmp_path):
    out = tmp_path / "c.safetensors"
    spec = CartridgeBuildSpec(corpus, out, engine.path, prefix_tokens=8, steps=3, accum=1, selfstudy=SMALL)
    with pytest.raises(BuildCancelled, match="after 1 of 3"):
        build_cartridge(spec, Recorder(cancel_after=1), engine)
    assert not out.exists() and not list(tmp_path.iterdir())


def test_negative_steps_are_refused(engine, corpus, tmp_path):
    with pytest.raises(ValueError, match="--steps -1"):
        build_cartridge(
            CartridgeBuildSpec(corpus, tmp_path / "c", engine.path, prefix_tokens=4, steps=-1), None, engine
        )


@pytest.mark.slow  # several seconds on a model: the slow tier (the fast one keeps under 5 minutes)
def test_the_saved_cartridge_is_the_best_held_out_checkpoint(engine, corpus):
    tokens = corpus_tokens(engine, corpus)
    start = initial_cartridge(engine, tokens[:8], frozen_rows=1)
    held = []
    config = TrainConfig(
        steps=6, lr=2e-2, accum=1, held_out=2, seed=1, eval_every=2, conversations=3, selfstudy=SMALL
    )
    pool = ConversationPool(engine, tokens, config.seed, SMALL)
    result = train_cartridge(
        engine, start, tokens, config, pool=pool, on_eval=lambda e: held.append((e.step, e.loss))
    )
    assert [s for s, _ in result.held_history] == [0, 2, 4, 6] and held == result.held_history
    assert len(pool) == 3  # six steps cycled over three conversations: epochs, nothing new made
    best_step, best_loss = min(result.held_history, key=lambda point: point[1])
    assert (result.best_step, result.loss_last) == (
        best_step,
        best_loss,
    ) and result.loss_last < result.loss_first
    fw = PrefixForward(engine.model)
    held_out = held_out_pool(engine, tokens, config).take(0, 2)
    assert mean_loss(fw, held_out, result.cartridge.k, result.cartridge.v) == result.loss_last
    # Gradient ascent (a negative rate) only makes things worse: the initialisation is kept.
    wild = train_cartridge(engine, start, tokens, replace(config, lr=-2e-2, steps=2, eval_every=1))
    assert wild.best_step == 0 and all(loss > wild.loss_first for _, loss in wild.held_history[1:])
    assert np.array_equal(wild.cartridge.k, start.k) and np.array_equal(wild.cartridge.v, start.v)


def test_a_held_out_spike_rewinds_to_the_best_rows_with_half_the_rate(engine, corpus):
    tokens = corpus_tokens(engine, corpus)
    start = initial_cartridge(engine, tokens[:8], frozen_rows=1)
    # One conversation, one a step: every step trains on the same conversation, so a run that
    # rewinds after its first step takes its second as a fresh run at half the rate takes its first.
    # (Random weights barely respond to their rows: a 5% rise stands for a spike here.)
    config = TrainConfig(
        steps=2,
        lr=10.0,
        accum=1,
        held_out=2,
        seed=1,
        eval_every=1,
        conversations=1,
        spike=0.05,
        selfstudy=SMALL,
    )
    pool = ConversationPool(engine, tokens, config.seed, SMALL)
    held = held_out_pool(engine, tokens, config)
    wild = train_cartridge(engine, start, tokens, config, pool=pool, held=held)
    (_, first), (_, spiked), (_, after) = wild.held_history
    assert spiked > first * (1 + config.spike) and wild.rewinds[0] == 1
    half = train_cartridge(engine, start, tokens, replace(config, lr=5.0, steps=1), pool=pool, held=held)
    assert after == half.held_history[1][1]
    assert wild.cartridge.training["rewinds"] == wild.rewinds
    # Without the guard the second step goes on from the spiked rows.
    unguarded = train_cartridge(engine, start, tokens, replace(config, spike=0.0), pool=pool, held=held)
    assert unguarded.rewinds == [] and unguarded.held_history[2][1] != after


@pytest.mark.slow
def test_a_timed_build_synthesises_then_trains_within_its_budget(engine, corpus, tmp_path):
    out, dataset = tmp_path / "c.safetensors", tmp_path / "dataset"
    minutes = 0.15
    spec = CartridgeBuildSpec(
        corpus,
        out,
        engine.path,
        prefix_tokens=8,
        minutes=minutes,
        dataset=dataset,
        accum=8,
        selfstudy=SMALL,
        synthesis_share=0.2,
    )
    progress = Recorder()
    t0 = time.perf_counter()
    result = build_cartridge(spec, progress, engine)
    elapsed = time.perf_counter() - t0
    step_seconds = elapsed / max(1, result.steps)
    # Steps stop at the first boundary past the deadline; one step and the last evaluation may follow it.
    assert elapsed < 60 * minutes + 3 * step_seconds + 5, (elapsed, result)
    assert result.steps > 0 and result.conversations > 0 and result.coverage > 0
    counts = [count for count, _ in progress.conversations]
    assert counts == sorted(counts) and counts[-1] == result.conversations
    assert progress.conversations[-1][1] == pytest.approx(result.coverage)
    assert (
        progress.held_out[0] == (0, result.loss_first)
        and min(h for _, h in progress.held_out) == result.loss_last
    )
    assert len(
        load_split(dataset, DatasetHeader.describe(engine, corpus_tokens(engine, corpus), 0, SMALL), "train")
    ) == (result.conversations)
    loaded = load_cartridge(out)
    assert loaded.training["loss_last"] == result.loss_last <= result.loss_first
    assert loaded.training["best_step"] == result.best_step


def test_a_build_trains_on_a_dataset_with_the_settings_it_was_made_with(engine, corpus, tmp_path):
    dataset = tmp_path / "dataset"
    tokens = corpus_tokens(engine, corpus)
    write_shard(engine, tokens, dataset, DatasetHeader.describe(engine, tokens, 0, SMALL), "train", 0, 2)
    write_shard(engine, tokens, dataset, DatasetHeader.describe(engine, tokens, 0, SMALL), "held_out", 0, 4)
    shards = {p.name: p.read_bytes() for p in dataset.iterdir()}
    spec = CartridgeBuildSpec(
        corpus, tmp_path / "c.safetensors", engine.path, prefix_tokens=8, steps=1, accum=2, held_out=4
    )
    result = build_cartridge(replace(spec, dataset=dataset), None, engine)  # defaults: the dataset's settings
    assert result.steps == 1 and {p.name: p.read_bytes() for p in dataset.iterdir()} == shards  # nothing new
    timed = replace(spec, dataset=dataset, steps=0, minutes=0.02, synthesis_share=0.0)
    result = build_cartridge(timed, None, engine)  # no synthesis share: epochs over what is there
    assert result.conversations == 2  # the steps that fit depend on the machine
    assert {p.name: p.read_bytes() for p in dataset.iterdir()} == shards
    other = replace(spec, dataset=dataset, selfstudy=replace(SMALL, max_answer=SMALL.max_answer + 1))
    with pytest.raises(
        ValueError, match=f"its conversations have max_answer {SMALL.max_answer}, this build asks"
    ):
        build_cartridge(other, None, engine)


def test_a_step_counted_build_writes_its_conversations_to_a_new_dataset(engine, corpus, tmp_path):
    dataset = tmp_path / "new"
    spec = CartridgeBuildSpec(
        corpus,
        tmp_path / "c.safetensors",
        engine.path,
        prefix_tokens=8,
        steps=1,
        accum=2,
        dataset=dataset,
        held_out=4,
    )
    build_cartridge(replace(spec, selfstudy=SMALL), None, engine)
    header = DatasetHeader.describe(engine, corpus_tokens(engine, corpus), 0, SMALL)
    assert sorted(load_split(dataset, header, "train")) == [0, 1]
    assert sorted(load_split(dataset, header, "held_out")) == [0, 1, 2, 3]


class Killed(Exception):
    """Stands for the process dying mid-training."""


def test_an_interrupted_training_resumes_from_its_saved_state(engine, corpus, tmp_path):
    tokens = corpus_tokens(engine, corpus)
    start = initial_cartridge(engine, tokens[:8], frozen_rows=1)
    config = TrainConfig(
        steps=6, lr=2e-2, accum=1, held_out=2, seed=1, eval_every=2, conversations=3, selfstudy=SMALL
    )
    pool = ConversationPool(engine, tokens, config.seed, SMALL)
    held = held_out_pool(engine, tokens, config)
    whole = train_cartridge(engine, start, tokens, config, pool=pool, held=held)

    def die_at_five(step: int, total: int, loss: float) -> None:
        if step == 5:
            raise Killed

    with pytest.raises(Killed):
        train_cartridge(engine, start, tokens, config, die_at_five, pool=pool, held=held, state_dir=tmp_path)
    (saved,) = tmp_path.iterdir()  # the state after the evaluation at step 4
    # Another training (another rate) does not start from it.
    other = train_cartridge(
        engine, start, tokens, replace(config, lr=1e-2), pool=pool, held=held, state_dir=tmp_path
    )
    assert other.resumed_step == 0 and list(tmp_path.iterdir()) == [saved]

    steps = []
    resumed = train_cartridge(
        engine,
        start,
        tokens,
        config,
        lambda s, t, loss: steps.append(s),
        pool=pool,
        held=held,
        state_dir=tmp_path,
    )
    assert resumed.resumed_step == 4 and steps == [5, 6]
    assert np.array_equal(resumed.cartridge.k, whole.cartridge.k)
    assert np.array_equal(resumed.cartridge.v, whole.cartridge.v)
    assert resumed.history == whole.history and resumed.held_history == whole.held_history
    assert (resumed.best_step, resumed.loss_last) == (whole.best_step, whole.loss_last)
    assert list(tmp_path.iterdir()) == []  # training ended: its state is gone
