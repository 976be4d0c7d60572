"""Joint fleet training: mixed visibility, the resident budget with rotation, and
evict/reload continuing bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from fleet.cartridges.file import Cartridge, load_cartridge, save_cartridge
from fleet.cartridges.init import initial_cartridge
from fleet.cartridges.selfstudy import SelfStudyConfig
from fleet.cartridges.train import Adam, TrainConfig, TrainingCancelled
from fleet.fleets.train import (
    FleetDocument,
    JointConfig,
    JointTrainer,
    Resident,
    load_resident,
    save_resident,
    train_fleet,
)
from inference.engine.engine import Engine
from tests.fixtures.synthetic_gguf import synthetic_path

SMALL = SelfStudyConfig(span_min=32, span_max=32, max_question=6, max_answer=8)
TEXTS = {
    "lighthouse": "The keeper Ilse Varga rows to Skerrow Island every Tuesday with 14 crates of lamp oil. "
    * 2,
    "bakery": "Bakery Ortolan opens at 5:40 and sells rye loaves with caraway for 3 crowns each day. " * 2,
    "railway": "The Vell Valley railway runs 9 trains a day between Amsel and Dorn over the Kettle bridge. "
    * 2,
}


def test_evict_and_reload_continue_bit_identically(tmp_path):
    rng = np.random.default_rng(0)
    k, v = rng.normal(size=(2, 1, 5, 4)).astype(np.float32), rng.normal(size=(2, 1, 5, 4)).astype(np.float32)
    grads = [
        (rng.normal(size=(2, 1, 4, 4)).astype(np.float32), rng.normal(size=(2, 1, 4, 4)).astype(np.float32))
        for _ in range(3)
    ]
    config = TrainConfig(steps=3, lr=1e-2)
    doc = FleetDocument("d", [1, 2], tmp_path / "d.safetensors")

    def fresh() -> Resident:
        c = Cartridge(k.copy(), v.copy(), b"\x01" * 16, frozen_rows=1)
        return Resident(0, c, Adam.zeros(c.k[:, :, 1:], c.v[:, :, 1:]), 0)

    def step(r: Resident, g) -> None:
        r.adam.step((r.cartridge.k[:, :, 1:], r.cartridge.v[:, :, 1:]), g, config)
        r.steps += 1

    stay, moved = fresh(), fresh()
    for i, g in enumerate(grads):
        step(stay, g)
        step(moved, g)
        if i < 2:  # out to disk and back between steps
            save_resident(doc, moved)
            moved = load_resident(0, doc)
    assert moved.steps == stay.steps == 3 and moved.adam.t == 3
    assert np.array_equal(moved.cartridge.k, stay.cartridge.k) and np.array_equal(
        moved.cartridge.v, stay.cartridge.v
    )
    assert np.array_equal(moved.adam.v_k, stay.adam.v_k) and np.array_equal(moved.adam.m_v, stay.adam.m_v)
    assert np.array_equal(moved.cartridge.k[:, :, :1], k[:, :, :1])  # the sink row never moves


@pytest.fixture(scope="module")
def engine(synthetic_dir):
    return Engine.load(synthetic_path("llama", synthetic_dir))


def initial_documents(engine, tmp_path) -> list[FleetDocument]:
    """TEXTS as fleet documents, each with its untrained cartridge of 6 rows on disk."""
    docs = []
    for name, text in TEXTS.items():
        tokens = engine.tokenizer.encode(text, add_bos=engine.tokenizer.add_bos)
        path = tmp_path / f"{name}.safetensors"
        save_cartridge(path, initial_cartridge(engine, tokens[:6]))
        docs.append(FleetDocument(name, tokens, path))
    return docs


def test_joint_training_rotates_and_co_loads(engine, tmp_path):
    docs = initial_documents(engine, tmp_path)
    before = {d.name: load_cartridge(d.cartridge_path).k for d in docs}
    config = JointConfig(
        rounds=6, budget=2, rotate_every=2, p_isolated=0.4, lr=1e-2, accum=1, seed=3, selfstudy=SMALL
    )
    rounds = []
    result = train_fleet(engine, docs, config, on_step=lambda *a: rounds.append(a))
    assert [r[:2] for r in rounds] == [(i, 6) for i in range(1, 7)] and len(result.history) == 6
    assert result.rotations >= 2 and result.co_loaded_rounds >= 1
    assert all(s > 0 for s in result.steps.values()), result.steps  # only 2 resident, all 3 trained
    # every co-loaded cartridge stepped: more steps than rounds
    assert sum(result.steps.values()) >= 6 + result.co_loaded_rounds
    for d in docs:
        after = load_cartridge(d.cartridge_path)
        assert not np.array_equal(after.k, before[d.name]) and d.state_path.exists()
        assert load_resident(0, d).steps == result.steps[d.name]


def test_budget_must_be_positive(engine, tmp_path):
    with pytest.raises(ValueError, match="budget 0"):
        train_fleet(engine, [FleetDocument("a", [1], tmp_path / "a")], JointConfig(rounds=1, budget=0))


@pytest.mark.slow  # several seconds on a model: the slow tier (the fast one keeps under 5 minutes)
def test_held_out_selection_keeps_each_documents_best_checkpoint(engine, tmp_path):
    """With held-out conversations each file holds the lowest-loss checkpoint it went through
    (the initialisation included), while training goes on from the state's rows. A step size
    far too large wrecks the cartridges, so the files must keep earlier checkpoints."""
    docs = initial_documents(engine, tmp_path)
    initial = {d.name: load_cartridge(d.cartridge_path) for d in docs}
    config = JointConfig(
        rounds=6, budget=2, rotate_every=2, lr=10.0, accum=1, held_out=2, seed=3, selfstudy=SMALL
    )
    trainer = JointTrainer(engine, docs, config)
    result = trainer.run()
    assert set(result.kept) == set(result.initial_loss) == set(TEXTS)
    for i, d in enumerate(docs):
        kept, state = result.kept[d.name], load_resident(i, d)
        in_file = Resident(i, load_cartridge(d.cartridge_path), state.adam, kept.step)
        assert trainer.held_out_loss(in_file) == kept.loss  # the file is the kept checkpoint
        assert kept.loss <= result.initial_loss[d.name]
        assert trainer.held_out_loss(state) >= kept.loss  # training's rows are no better
        if kept.step == 0:
            assert np.array_equal(in_file.cartridge.k, initial[d.name].k)
    assert any(result.kept[name].step < steps for name, steps in result.steps.items())


def test_a_cancelled_run_keeps_the_files_checkpoints_and_saves_its_progress(engine, tmp_path):
    """Cancelled, training writes each resident's state without measuring it (the model does
    not run again): with held-out selection the files keep their checkpoints, here the
    initialisations, while the states hold the rows trained so far."""
    docs = initial_documents(engine, tmp_path)
    initial = {d.name: load_cartridge(d.cartridge_path) for d in docs}
    config = JointConfig(rounds=4, budget=3, lr=1e-2, accum=1, held_out=2, seed=3, selfstudy=SMALL)
    trainer = JointTrainer(engine, docs, config)
    measured = []
    held_out_loss = trainer.held_out_loss
    trainer.held_out_loss = lambda r: measured.append(r.doc) or held_out_loss(r)
    with pytest.raises(TrainingCancelled, match="after 2 of 4"):
        trainer.run(cancelled=lambda: len(trainer.steps) and sum(trainer.steps.values()) >= 2)
    assert sorted(measured) == [0, 1, 2]  # the initialisations, at load; nothing at the cancel
    trained = [i for i, d in enumerate(docs) if load_resident(i, d).steps > 0]
    assert trained
    for i in trained:
        d = docs[i]
        assert np.array_equal(load_cartridge(d.cartridge_path).k, initial[d.name].k)
        assert not np.array_equal(load_resident(i, d).cartridge.k, initial[d.name].k)
