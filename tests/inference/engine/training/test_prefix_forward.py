"""The training forward behind a prefix: its gradient to the prefix against finite differences
(float64) on every family, the checkpointed mode, and agreement with the exact engine."""

from __future__ import annotations

import numpy as np
import pytest

from fleet.cartridges.init import initial_cartridge
from inference.engine.engine import Engine
from inference.engine.training import PrefixForward
from inference.engine.training.weights import UnsupportedModelError, training_weights
from tests.fixtures.synthetic_gguf import synthetic_path

ARCHS = ("llama", "qwen2", "qwen3", "gemma3")
TEXT = "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun. " * 4


@pytest.fixture(scope="module", params=ARCHS)
def engine(request, synthetic_dir):
    return Engine.load(synthetic_path(request.param, synthetic_dir))


def _tokens(engine: Engine) -> list[int]:
    return engine.tokenizer.encode(TEXT, add_bos=engine.tokenizer.add_bos)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64) - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


@pytest.mark.slow  # several seconds on a model: the slow tier (the fast one keeps under 5 minutes)
def test_prefix_gradient_matches_finite_differences(engine):
    """d/dprefix of sum(logits * R) by backward vs central differences along random
    directions (float64 end to end), with the head on a subset of rows."""
    rng = np.random.default_rng(3)
    tokens = _tokens(engine)
    cart = initial_cartridge(engine, tokens[:6], frozen_rows=0)
    k, v = cart.k.astype(np.float64), cart.v.astype(np.float64)
    suffix, rows = tokens[6:11], [1, 3, 4]
    fw = PrefixForward(engine.model)
    logits, tape = fw.forward(suffix, k, v, head_rows=rows)
    weights = rng.normal(size=logits.shape)
    dk, dv = fw.backward(tape, weights)

    def loss(kk, vv):
        return float(np.sum(fw.forward(suffix, kk, vv, head_rows=rows)[0] * weights))

    h = 1e-4
    for _ in range(2):
        dir_k, dir_v = rng.normal(size=k.shape), rng.normal(size=v.shape)
        numeric = (loss(k + h * dir_k, v + h * dir_v) - loss(k - h * dir_k, v - h * dir_v)) / (2 * h)
        analytic = float(np.sum(dk * dir_k) + np.sum(dv * dir_v))
        assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(analytic)), (numeric, analytic)
    # one coordinate of a key in the first layer (the longest path back)
    bump = np.zeros_like(k)
    bump[0, 0, 2, 1] = h
    numeric = (loss(k + bump, v) - loss(k - bump, v)) / (2 * h)
    assert abs(numeric - dk[0, 0, 2, 1]) <= 1e-6 * max(1.0, abs(numeric))


def test_checkpointed_backward_is_bitwise_the_stored_one(engine):
    tokens = _tokens(engine)
    cart = initial_cartridge(engine, tokens[:8])
    fw = PrefixForward(engine.model)
    dlogits = np.random.default_rng(1).normal(size=(4, engine.config.vocab_size)).astype(np.float32)
    results = []
    for checkpoint in (False, True):
        rows = [2, 5, 9, 11]
        logits, tape = fw.forward(tokens[8:20], cart.k, cart.v, head_rows=rows, checkpoint=checkpoint)
        assert (len(tape.saved) == 0) == checkpoint
        results.append((logits, *fw.backward(tape, dlogits)))
    for a, b in zip(*results, strict=True):
        assert a.dtype == np.float32 and np.array_equal(a, b)


def test_forward_agrees_with_the_exact_engine(engine):
    """Behind an initial cartridge, the float32 forward's next-token distributions match the
    exact engine's (which rounds activations to 8 bits and the cache to f16) within a mean KL
    of 0.02 nats and the same argmax on at least 85% of rows; the gap is the engine's rounding."""
    tokens = _tokens(engine)
    p = 16
    cart = initial_cartridge(engine, tokens[:p])
    cache = engine.new_cache(64)
    engine.prefill(cache, tokens[:p])
    exact = engine.model.forward(tokens[p : p + 24], cache, all_logits=True)  # (24, vocab)
    logits, _ = PrefixForward(engine.model).forward(tokens[p : p + 24], cart.k, cart.v)
    ref = _log_softmax(exact)
    kl = np.sum(np.exp(ref) * (ref - _log_softmax(logits)), axis=-1)
    assert kl.mean() < 0.02, kl
    assert np.mean(logits.argmax(-1) == exact.argmax(-1)) >= 0.85


def test_prefix_rows_act_like_the_tokens_they_came_from(engine):
    """The float32 forward of prefix + suffix equals (to float32 noise) the float32 forward of
    the whole sequence behind a one-row prefix whose other rows it recomputed itself: the
    prefix enters attention exactly as the tokens' own keys would."""
    tokens = _tokens(engine)
    fw = PrefixForward(engine.model)
    cart = initial_cartridge(engine, tokens[:1], frozen_rows=0)
    whole, tape = fw.forward(tokens[1:20], cart.k, cart.v)
    # rebuild the rows of tokens[1:8] from the float32 forward's own keys and values
    k = np.concatenate([cart.k, np.stack([s.keys[:, 1:8] for s in tape.saved])], axis=2)
    v = np.concatenate([cart.v, np.stack([s.values[:, 1:8] for s in tape.saved])], axis=2)
    split, _ = fw.forward(tokens[8:20], k, v)
    assert np.abs(split - whole[7:]).max() <= 1e-4 * np.abs(whole).max()


def test_mixture_of_experts_is_refused(synthetic_dir):
    engine = Engine.load(synthetic_path("qwen3moe", synthetic_dir))
    with pytest.raises(UnsupportedModelError, match="qwen3moe"):
        training_weights(engine.model)


@pytest.mark.slow
def test_smollm2_forward_agrees_with_the_exact_engine():
    """On the real SmolLM2-135M (Q4_1), behind an initial cartridge of 24 rows: mean KL of the
    next-token distributions < 0.005 nats (measured ~0.001), max < 0.02; where the two argmaxes
    differ it is a near tie: the exact engine gives the float32 forward's choice a probability
    within 0.1 of its own top token's."""
    from inference.model_files import DEFAULT_MODEL_FILE, DEFAULT_MODEL_PACKAGE, installed_file

    engine = Engine.load(installed_file(DEFAULT_MODEL_PACKAGE, DEFAULT_MODEL_FILE))
    tokens = engine.tokenizer.encode("Paris is the capital of France, and Berlin of Germany. " * 4)
    p = 24
    cart = initial_cartridge(engine, tokens[:p])
    cache = engine.new_cache(96)
    engine.prefill(cache, tokens[:p])
    exact = engine.model.forward(tokens[p : p + 24], cache, all_logits=True)
    logits, _ = PrefixForward(engine.model).forward(tokens[p : p + 24], cart.k, cart.v)
    ref = _log_softmax(exact)
    kl = np.sum(np.exp(ref) * (ref - _log_softmax(logits)), axis=-1)
    assert kl.mean() < 0.005 and kl.max() < 0.02, kl
    probs = np.exp(ref)
    chosen = probs[np.arange(len(probs)), logits.argmax(-1)]
    assert np.all(chosen >= probs.max(-1) - 0.1), probs.max(-1) - chosen
