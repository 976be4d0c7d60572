"""The sampler: greedy, truncations, penalties, and seeded reproducibility."""

import numpy as np
import pytest

from inference.engine.sampler import Sampler, SamplingParams, apply_penalties


def logits_of(*values):
    return np.array(values, dtype=np.float32)


def draws(params, logits, n=400):
    sampler = Sampler(params)
    return [sampler.sample(logits) for _ in range(n)]


def test_greedy_takes_the_argmax():
    assert Sampler(SamplingParams()).sample(logits_of(0.1, 3.0, 2.9, -1)) == 1


def test_top_k_one_is_greedy_even_when_hot():
    assert set(draws(SamplingParams(temperature=5.0, top_k=1, seed=1), logits_of(0, 1, 0.5))) == {1}


def test_top_k_limits_the_candidates():
    seen = set(draws(SamplingParams(temperature=10.0, top_k=2, seed=2), logits_of(5, 4, 3, 2, 1)))
    assert seen == {0, 1}


def test_top_p_keeps_the_smallest_set_reaching_p():
    # probabilities ~ 0.64, 0.24, 0.09, 0.03: top_p 0.8 keeps the first two
    logits = np.log(logits_of(0.64, 0.24, 0.09, 0.03))
    assert set(draws(SamplingParams(temperature=1.0, top_p=0.8, seed=3), logits)) == {0, 1}


def test_min_p_drops_tokens_below_a_fraction_of_the_best():
    logits = np.log(logits_of(0.5, 0.3, 0.15, 0.05))
    assert set(draws(SamplingParams(temperature=1.0, min_p=0.25, seed=4), logits)) == {0, 1, 2}


def test_temperature_sharpens_and_flattens():
    logits = logits_of(1.0, 0.0)
    cold = draws(SamplingParams(temperature=0.2, seed=5), logits).count(0)
    hot = draws(SamplingParams(temperature=5.0, seed=5), logits).count(0)
    assert cold > 380 and 180 < hot < 300


def test_same_seed_same_draws_and_different_seed_differs():
    logits = np.zeros(50, np.float32)
    a = draws(SamplingParams(temperature=1.0, seed=42), logits, 50)
    b = draws(SamplingParams(temperature=1.0, seed=42), logits, 50)
    c = draws(SamplingParams(temperature=1.0, seed=43), logits, 50)
    assert a == b and a != c


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits():
    out = apply_penalties(logits_of(2.0, -2.0, 1.0), [0, 1], SamplingParams(repeat_penalty=2.0))
    assert out.tolist() == [1.0, -4.0, 1.0]


def test_presence_and_frequency_penalties_follow_openai():
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_penalties(logits_of(1.0, 1.0, 1.0), [0, 0, 0, 1], params)
    assert out.tolist() == pytest.approx([1.0 - 0.75 - 0.5, 1.0 - 0.25 - 0.5, 1.0])


def test_penalties_only_look_at_the_last_n_tokens():
    out = apply_penalties(logits_of(1.0, 1.0), [0, 1], SamplingParams(presence_penalty=1.0, repeat_last_n=1))
    assert out.tolist() == [1.0, 0.0]


def test_greedy_with_penalty_changes_the_pick():
    params = SamplingParams(repeat_penalty=4.0)
    assert Sampler(params).sample(logits_of(2.0, 1.0), history=[0]) == 1


def test_a_vanishing_repeat_penalty_stays_finite_and_samples():
    # 5e-324 (what a fuzzer sends) divided the repeated token's logit to infinity, and the
    # softmax then turned every probability into NaN: a 500 instead of a reply.
    params = SamplingParams(repeat_penalty=5e-324, temperature=1.0, seed=1)
    out = apply_penalties(logits_of(3.0, -2.0, 1.0), [0, 1], params)
    assert np.isfinite(out).all()
    assert Sampler(params).sample(logits_of(3.0, -2.0, 1.0), [0, 1]) == 0  # the repeated token wins


def test_a_vanishing_temperature_is_greedy_not_nan():
    # logits / 5e-324 overflowed to inf before the softmax subtracted the maximum.
    params = SamplingParams(temperature=5e-324, seed=3)
    assert set(draws(params, logits_of(1.0, 3.0, 2.0), n=20)) == {1}
