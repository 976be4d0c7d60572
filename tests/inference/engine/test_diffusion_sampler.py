"""The entropy-bound sampler (inference/engine/diffusion_sampler.py): the temperature schedule,
one sampler pass against a plain per-row reference, the acceptance rule, the loop trim, and
the block loop (commit, EOG trim, budget, early stop) over a scripted model."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from inference.engine.diffusion_sampler import (
    SC_P_MIN,
    denoise,
    entropy_bound_accept,
    generate_blocks,
    repetition_onset,
    sampler_pass,
    temperature,
)
from inference.engine.models.diffusion_gemma import DiffusionConfig, EntropyBound


def test_temperature_falls_linearly_from_t_max():
    eb = EntropyBound()
    temps = [temperature(step, eb) for step in range(eb.max_steps)]
    assert temps[0] == pytest.approx(0.8)
    assert temps[-1] == pytest.approx(0.4 + 0.4 / 48)  # the reference's schedule never reaches t_min
    assert np.allclose(np.diff(temps), -0.4 / 48)


def test_acceptance_follows_the_mutual_information_bound():
    entropy = np.array([0.02, 0.05, 0.6, 0.01])
    # Rising order 3, 0, 1, 2: the entropy ahead of each is 0, 0.01, 0.03, 0.08.
    assert entropy_bound_accept(entropy, 0.1).tolist() == [True, True, True, True]
    assert entropy_bound_accept(entropy, 0.04).tolist() == [True, True, False, True]
    # The lowest-entropy position is always accepted, however high; ties go in position order.
    assert entropy_bound_accept(np.array([5.0, 3.0, 3.0]), 0.1).tolist() == [False, True, False]


def reference_row(row: np.ndarray, temp: float, u: float) -> tuple[int, int, float, dict[int, float]]:
    """argmax, draw, entropy and self-conditioning candidates of one row, written plainly."""
    z = row.astype(np.float64) / temp
    p = np.exp(z - z.max())
    p /= p.sum()
    draw = int(np.searchsorted(np.cumsum(p), u))  # first id whose cumulative mass reaches u
    kept = {i: p[i] for i in np.flatnonzero(p >= SC_P_MIN)[:512]}
    total = sum(kept.values())
    entropy = -np.sum(p[p > 0] * np.log(p[p > 0]))
    return int(np.argmax(row)), draw, entropy, {i: v / total for i, v in kept.items()}


def test_sampler_pass_matches_a_plain_reference():
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((20, 3000)) * 4).astype(np.float32)  # (n, vocab)
    logits[3, 17] = 80.0  # one row certain of its token
    u = rng.random(20)
    draw = sampler_pass(logits, 0.7, u, collect_sc=True)
    for r in range(20):
        argmax, sampled, entropy, kept = reference_row(logits[r], 0.7, u[r])
        assert (draw.argmax[r], draw.sampled[r]) == (argmax, sampled)
        assert draw.entropy[r] == pytest.approx(entropy, abs=1e-6)
        lo, hi = draw.sc.offsets[r], draw.sc.offsets[r + 1]
        assert draw.sc.ids[lo:hi].tolist() == list(kept)
        np.testing.assert_allclose(draw.sc.probs[lo:hi], list(kept.values()), rtol=1e-5)
    assert draw.entropy[3] < 1e-6 and draw.sc.offsets[4] - draw.sc.offsets[3] == 1
    assert sampler_pass(logits, 0.7, u, collect_sc=False).sc is None


def test_the_reference_example_of_one_pass():
    logits = np.array([[0, 0, 8, 0], [1, 1, 1, 1]], np.float32)
    draw = sampler_pass(logits, 1.0, np.array([0.5, 0.6]), collect_sc=True)
    assert draw.argmax.tolist() == [2, 0] and draw.sampled.tolist() == [2, 2]
    assert draw.entropy[0] < 0.01 and draw.entropy[1] == pytest.approx(np.log(4))


def test_repetition_loop_onset():
    assert repetition_onset(np.arange(1, 11)) is None
    assert repetition_onset(np.array([1, 2, 3, 9, 9, 9, 9, 9, 9, 9])) == 3
    assert (
        repetition_onset(np.array([5, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1])) == 2
    )  # the reference's count
    assert repetition_onset(np.array([4, 9, 9, 9, 9, 9, 9])) is None  # five repeats only


# -- the block loop over a scripted model ----------------------------------------------------
VOCAB, CANVAS, STOP = 64, 8, 63


@dataclass
class FakeCache:
    tokens: list[int] = field(default_factory=list)

    @property
    def n_positions(self) -> int:
        return len(self.tokens)


@dataclass
class ScriptedModel:
    """Certain of token ``(position + 1) % 50`` at every canvas row, except where ``stops``
    (absolute positions) say the end-of-generation token; or, ``unsure``, of nothing."""

    stops: tuple[int, ...] = ()
    unsure: bool = False
    diffusion: DiffusionConfig = DiffusionConfig(CANVAS, EntropyBound(max_steps=6))
    config: object = type("Config", (), {"vocab_size": VOCAB})()
    self_cond = None
    forwards: int = 0

    def encode(self, tokens: list[int], cache: FakeCache) -> None:
        cache.tokens.extend(tokens)

    def canvas_forward(self, canvas: np.ndarray, cache: FakeCache, sc=None) -> np.ndarray:
        self.forwards += 1
        logits = np.zeros((len(canvas), VOCAB), np.float32)  # (n, vocab)
        if not self.unsure:
            for r in range(len(canvas)):
                pos = cache.n_positions + r
                logits[r, STOP if pos in self.stops else (pos + 1) % 50] = 100.0
        return logits


def test_blocks_are_committed_whole_and_the_eog_block_is_trimmed():
    model, cache = ScriptedModel(stops=(3 + CANVAS + 5,)), FakeCache()
    blocks = list(generate_blocks(model, cache, [7, 7, 7], 100, frozenset({STOP}), seed=1))
    assert [b.tokens for b in blocks] == [list(range(4, 12)), list(range(12, 17))]
    assert [b.finished for b in blocks] == [False, True]
    assert cache.tokens == [7, 7, 7, *range(4, 12)]  # the prompt and the first canvas, whole
    # A certain model stops early: its argmax canvas holds still on the second step.
    assert [b.steps for b in blocks] == [2, 2] and model.forwards == 4


def test_the_budget_cuts_the_last_block():
    blocks = list(generate_blocks(ScriptedModel(), FakeCache(), [1], 10, frozenset({STOP}), seed=1))
    assert [len(b.tokens) for b in blocks] == [8, 2] and not blocks[-1].finished


def test_an_unsure_model_runs_every_step():
    model = ScriptedModel(unsure=True)
    eb = model.diffusion.sampler
    canvas, steps = denoise(model, FakeCache([1]), np.random.default_rng(3), eb)
    assert steps == eb.max_steps  # uniform logits: entropy ln(64) never gets confident
    assert canvas.tolist() == [0] * CANVAS  # the argmax of uniform rows: the first id
    cancelled = generate_blocks(model, FakeCache(), [1], 100, frozenset(), seed=1, cancelled=lambda: True)
    assert list(cancelled) == []


def test_a_hang_up_between_steps_ends_the_block_loop_unfinished():
    model = ScriptedModel(unsure=True)

    def cancelled() -> bool:
        return model.forwards >= 2  # the client leaves during the second step

    assert list(generate_blocks(model, FakeCache(), [1], 100, frozenset(), seed=1, cancelled=cancelled)) == []
    assert model.forwards == 2  # not the six steps of a whole canvas
