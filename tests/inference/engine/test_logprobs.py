"""Log probabilities of a token and its alternatives, against a plain numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from inference.engine import logprobs as lp
from inference.engine.sampler import Sampler, SamplingParams


def reference_log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    finite = x[np.isfinite(x)]
    return x - (finite.max() + np.log(np.exp(finite - finite.max()).sum()))


def reference_top(logprobs: np.ndarray, n: int) -> list[tuple[int, float]]:
    ranked = sorted(
        (i for i in range(len(logprobs)) if np.isfinite(logprobs[i])), key=lambda i: (-logprobs[i], i)
    )
    return [(i, float(logprobs[i])) for i in ranked[:n]]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("top_n", [0, 1, 5, 20])
def test_matches_a_numpy_log_softmax_and_ranks_like_a_sort(seed, top_n):
    rng = np.random.default_rng(seed)
    scores = (rng.standard_normal(5000) * 4).astype(np.float32)
    token = int(rng.integers(5000))
    dist = lp.token_distribution(scores, token, top_n)
    want = reference_log_softmax(scores)
    # The bulk of the exponentials run in float32 (log_normalizer): ~1e-8 from float64's.
    assert dist.chosen == (token, pytest.approx(want[token], abs=1e-7))
    assert [t.id for t in dist.top] == [i for i, _ in reference_top(want, top_n)]
    np.testing.assert_allclose(
        [t.logprob for t in dist.top], [v for _, v in reference_top(want, top_n)], atol=1e-7
    )
    assert all(t.logprob <= 0.0 for t in dist.top)
    assert sum(np.exp(t.logprob) for t in dist.top) <= 1.0 + 1e-12


def test_a_confident_distribution_is_exact_where_the_mass_is_and_sums_to_at_most_one():
    scores = np.full(150_000, -20.0, dtype=np.float32)
    scores[[3, 9]] = [12.0, 10.5]
    dist = lp.token_distribution(scores, 3, 20)
    want = reference_log_softmax(scores)
    assert dist.chosen.logprob == pytest.approx(want[3], abs=1e-13) and dist.chosen.logprob <= 0.0
    assert [t.id for t in dist.top[:2]] == [3, 9]
    assert sum(np.exp(t.logprob) for t in dist.top) <= 1.0


def test_ties_are_ranked_by_ascending_id_across_the_cut():
    scores = np.zeros(50, dtype=np.float32)
    scores[[7, 3, 40, 12]] = 2.0  # four tied leaders
    scores[[30, 5, 20]] = 1.0  # three tied runners-up, two of which fit in a top-6
    dist = lp.token_distribution(scores, 3, 6)
    assert [t.id for t in dist.top] == [3, 7, 12, 40, 5, 20]
    assert dist.top[0].logprob == dist.top[3].logprob > dist.top[4].logprob == dist.top[5].logprob


def test_masked_tokens_are_minus_infinity_and_never_alternatives():
    logits = np.linspace(-3, 3, 100, dtype=np.float32)
    allowed = np.zeros(100, dtype=bool)
    allowed[[2, 10, 11]] = True
    scores = Sampler(SamplingParams()).scores(logits, (), allowed)
    dist = lp.token_distribution(scores, 11, 20)
    assert [t.id for t in dist.top] == [11, 10, 2]  # only three tokens are allowed
    assert sum(np.exp(t.logprob) for t in dist.top) == pytest.approx(1.0)
    assert np.isneginf(lp.log_softmax(scores)[99])  # the most likely logit, masked


def test_huge_logits_do_not_overflow():
    scores = np.array([1e30, 1e30 - 1e24, -1e30], dtype=np.float32)
    values = lp.log_softmax(scores)
    assert np.all(np.isfinite(values[:2])) and values[0] <= 0.0


def test_temperature_is_applied_only_as_the_named_constant_says(monkeypatch):
    scores = np.array([2.0, 1.0, 0.0], dtype=np.float32)
    assert not lp.LOGPROBS_AFTER_TEMPERATURE  # the documented choice (docs/API.md)
    np.testing.assert_array_equal(lp.log_softmax(scores, 0.5), lp.log_softmax(scores))
    monkeypatch.setattr(lp, "LOGPROBS_AFTER_TEMPERATURE", True)
    np.testing.assert_allclose(lp.log_softmax(scores, 0.5), reference_log_softmax(scores / 0.5))
    np.testing.assert_allclose(lp.log_softmax(scores, 0.0), reference_log_softmax(scores))  # greedy


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(temperature=0.8, top_k=5, top_p=0.9, min_p=0.05, repeat_penalty=1.2, seed=3),
    ],
)
def test_scores_then_choose_is_sample(params):
    rng = np.random.default_rng(0)
    history = list(rng.integers(0, 300, 40))
    one, two = Sampler(params), Sampler(params)
    for _ in range(20):
        logits = rng.standard_normal(300).astype(np.float32)
        assert one.sample(logits, history) == two.choose(two.scores(logits, history))
