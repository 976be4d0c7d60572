"""Qwen3.5 (dense and MoE) on its synthetic files: the bytes llama.cpp was recorded on, the
layer pattern and M-RoPE sections read from the metadata, an independent float64 reference of
the DeltaNet steps, path invariance (chunked prefill, one-token decode and several
conversations in one forward give the same bits), the recurrent cache's rules, and what the
family tells the server. Fidelity against llama.cpp itself is in test_fidelity.py (goldens
generation_synthetic-qwen35*)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from inference.engine.engine import Engine
from inference.engine.families import FAMILIES, StateKind
from inference.engine.models.base import Run
from inference.engine.models.deltanet import (
    causal_conv,
    delta_rule,
    delta_rule_reference,
    l2_norm,
    sigmoid,
    softplus,
)
from inference.engine.models.qwen35 import imrope_static_pairs
from inference.engine.prefix import KVPrefix
from tests.fixtures.synthetic_qwen35 import SPECS, qwen35_path

GOLDENS_DIR = Path(__file__).resolve().parents[2] / "goldens"
TOKENS = np.random.default_rng(35).integers(3, 150000, 24).tolist()


@pytest.fixture(scope="module", params=list(SPECS))
def engine(request, synthetic_dir) -> Engine:
    return Engine.load(qwen35_path(request.param, synthetic_dir))


@pytest.mark.parametrize("name", list(SPECS))
def test_bytes_match_the_file_llama_cpp_was_recorded_on(name, synthetic_dir):
    path = qwen35_path(name, synthetic_dir)
    golden = json.loads((GOLDENS_DIR / f"generation_synthetic-{name}.json").read_text(encoding="utf-8"))
    assert path.name == golden["model_file"] and golden["synthetic_arch"] == name
    assert golden["architecture"] == SPECS[name].arch
    assert hashlib.sha256(path.read_bytes()).hexdigest() == golden["sha256"]


def test_layer_pattern_and_rope_sections_follow_the_metadata(synthetic_dir):
    dense = Engine.load(qwen35_path("qwen35", synthetic_dir)).model
    assert dense.recurrent == [True, False, True, False]  # full_attention_interval 2
    assert dense.kv_slot == {1: 0, 3: 1} and dense.state_slot == {0: 0, 2: 1}
    moe = Engine.load(qwen35_path("qwen35moe", synthetic_dir)).model
    assert moe.recurrent == [True, True, False]
    cache = moe.new_cache(8)
    assert cache.geometry.n_layers == 1  # KV rows for the one full-attention layer only
    assert cache.recurrent.ssm.shape == (2, 4, 32, 32) and cache.recurrent.conv.shape == (2, 256, 3)
    # Sections (3, 3, 1, 1) over 8 pairs: pair 5 takes the e position, 0 for text.
    assert np.flatnonzero(dense.static_pairs).tolist() == [5]


def test_the_released_sections_rotate_every_pair():
    # Qwen3.5's files: sections (11, 11, 10, 0) over 32 pairs (a quarter of a 256-wide head).
    assert not imrope_static_pairs([11, 11, 10, 0], 32).any()
    assert np.flatnonzero(imrope_static_pairs([2, 2, 2, 2], 8)).tolist() == [6, 7]


# -- an independent reference of the DeltaNet steps (float64, written from the definition) ---


def reference_delta_rule(q, k, v, g, beta, state):
    """HF's recurrent gated delta rule per head in float64, with S (d_k, d_v) as the engine
    holds it: S <- exp(g) S; S <- S + k (beta (v - S^T k))^T; o = S^T q / sqrt(d). Key head
    h % Hk serves value head h."""
    n, n_k, d = q.shape
    n_v = v.shape[1]
    s = state.astype(np.float64).copy()
    out = np.zeros((n, n_v, v.shape[2]))
    for t in range(n):
        for h in range(n_v):
            kh, qh = k[t, h % n_k].astype(np.float64), q[t, h % n_k].astype(np.float64)
            s[h] *= np.exp(float(g[t, h]))
            s[h] += np.outer(kh, float(beta[t, h]) * (v[t, h] - kh @ s[h]))
            out[t, h] = qh @ s[h] / np.sqrt(d)
    return out, s


@pytest.mark.parametrize("rule", [delta_rule, delta_rule_reference], ids=["numba", "numpy"])
def test_delta_rule_matches_a_float64_reference(rule):
    rng = np.random.default_rng(1)
    n, n_k, n_v, d = 9, 2, 4, 16
    q = l2_norm(rng.normal(size=(n, n_k, d)).astype(np.float32), 1e-6)
    k = l2_norm(rng.normal(size=(n, n_k, d)).astype(np.float32), 1e-6)
    v = rng.normal(size=(n, n_v, d)).astype(np.float32)
    g = (softplus(rng.normal(-2, 1, (n, n_v))) * -rng.uniform(1, 8, n_v)).astype(np.float32)
    beta = sigmoid(rng.normal(size=(n, n_v)))
    start = rng.normal(0, 0.3, (n_v, d, d)).astype(np.float32)
    state = start.copy()
    out = rule(q, k, v, g, beta, state)
    ref_out, ref_state = reference_delta_rule(q, k, v, g, beta, start)
    np.testing.assert_allclose(out, ref_out, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(state, ref_state, atol=2e-5, rtol=1e-4)
    # Run in two pieces from the saved state, the same state and outputs come out.
    state2 = start.copy()
    parts = [rule(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], state2) for a, b in ((0, 4), (4, n))]
    assert np.array_equal(np.concatenate(parts), out) and np.array_equal(state2, state)


def test_l2_norm_and_causal_conv_match_their_definitions():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(5, 3, 8)).astype(np.float32)
    expected = x / np.sqrt((x.astype(np.float64) ** 2).sum(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(l2_norm(x, 1e-6), expected, rtol=1e-6)
    channels, d_conv, n = 6, 4, 7
    inputs = rng.normal(size=(n, channels)).astype(np.float32)
    weight = rng.normal(size=(channels, d_conv)).astype(np.float32)
    state = np.zeros((channels, d_conv - 1), np.float32)
    out = causal_conv(inputs[:3], state, weight)
    out = np.concatenate([out, causal_conv(inputs[3:], state, weight)])  # the state carries over
    for c in range(channels):  # out[t] = sum_j w[j] x[t - (d_conv-1) + j], zeros before the start
        full = np.convolve(inputs[:, c].astype(np.float64), weight[c, ::-1].astype(np.float64))[:n]
        np.testing.assert_allclose(out[:, c], full, rtol=1e-5, atol=1e-6)
    assert np.array_equal(state, inputs[-(d_conv - 1) :].T)


# -- path invariance and the recurrent cache ----------------------------------------------------


def test_prefill_chunks_and_one_token_decode_give_the_same_bits(engine):
    whole = engine.verify(engine.new_cache(32), TOKENS)  # (n, vocab) every position
    cache = engine.new_cache(32)
    pieces = [engine.model.forward(TOKENS[a:b], cache, all_logits=True) for a, b in ((0, 7), (7, 8), (8, 24))]
    assert np.array_equal(np.concatenate(pieces), whole)
    cache = engine.new_cache(32)
    assert np.array_equal(np.stack([engine.decode_one(cache, t) for t in TOKENS]), whole)


def test_several_conversations_in_one_forward_equal_separate_forwards(engine):
    a, b = TOKENS[:10], TOKENS[10:]
    alone = [engine.model.forward(run, engine.new_cache(32), all_logits=True) for run in (a, b)]
    together = engine.forward([Run(engine.new_cache(32), a, True), Run(engine.new_cache(32), b, True)])
    assert all(np.array_equal(x, y) for x, y in zip(alone, together, strict=True))


def test_the_recurrent_cache_is_kept_whole_or_emptied(engine):
    cache = engine.new_cache(32)
    first = engine.prefill(cache, TOKENS[:12])
    assert np.abs(cache.recurrent.ssm).max() > 0
    cache.truncate(12)  # its own length: nothing to cut
    with pytest.raises(ValueError, match="cannot be cut back to 5 of its 12 tokens"):
        cache.truncate(5)
    # A prompt that continues the cached tokens runs on from the state ...
    assert engine.reuse_prefix(cache, TOKENS[:14]) == 12
    assert np.array_equal(
        engine.prefill(cache, TOKENS[12:14]), engine.verify(engine.new_cache(32), TOKENS[:14])[-1]
    )
    # ... any other starts from an empty cache, a shorter or an equal one too.
    for prompt in (TOKENS[:3], TOKENS[:14]):
        assert engine.reuse_prefix(cache, prompt) == 0
        assert cache.n_tokens == 0 and not cache.recurrent.ssm.any() and not cache.recurrent.conv.any()
    assert np.array_equal(engine.prefill(cache, TOKENS[:12]), first)
    prefix = KVPrefix(np.zeros((1, 2, 1, 32), np.float32), np.zeros((1, 2, 1, 32), np.float32))
    with pytest.raises(ValueError, match="cannot run behind a KV prefix"):
        cache.install_prefix(prefix)
    with pytest.raises(ValueError, match="cannot share rows"):
        engine.new_cache(32).copy_rows_from(cache, 4)


def test_family_serving_facts(engine):
    family = FAMILIES[engine.file.architecture]
    assert family.state is StateKind.RECURRENT and engine.chat_template.supports_tools
    assert family.tools is not None and family.think is not None and family.grammar
    assert (family.kv_reuse, family.batch, family.spec) == (False, False, False)
    assert family.backend == "recurrent" and family.think_prefilled
    hi = [{"role": "user", "content": "Hi"}]
    assert engine.render_chat(hi).endswith("<|im_start|>assistant\n<think>\n")
    off = engine.render_chat(hi, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert engine.tokenizer.token_id("<|im_end|>") in engine.stop_ids


def test_the_qwen35_pre_tokenizer_keeps_combining_marks_in_words():
    from inference.engine.tokenizer.pretokenizers import PreTokenizer

    text = "Cafe\u0301 na\u0308ive 12"
    assert PreTokenizer("qwen35").split(text) == ["Cafe\u0301", " na\u0308ive", " ", "1", "2"]
    assert PreTokenizer("qwen2").split(text)[:2] == ["Cafe", "\u0301"]  # Qwen2 splits the mark off


class FakeFile:
    """Just the metadata the layer-kind and DeltaNet readers take."""

    path, architecture = "fake.gguf", "qwen35"

    def __init__(self, **values):
        self.values = values

    def arch_value(self, key, default=None):
        return self.values.get(key, default)


def test_layer_kinds_and_deltanet_metadata_errors():
    from inference.engine.gguf_file import GGUFError
    from inference.engine.models.qwen35 import deltanet_shape, recurrent_layers

    assert recurrent_layers(FakeFile(), 8) == [True, True, True, False] * 2  # the default interval 4
    assert recurrent_layers(FakeFile(**{"attention.recurrent_layers": [1, 0, 0, 1, 1]}), 4) == [
        True,
        False,
        False,
        True,
    ]
    keys = {"ssm.group_count": 2, "ssm.time_step_rank": 4, "ssm.state_size": 8, "ssm.inner_size": 32}
    with pytest.raises(GGUFError, match="qwen35.ssm.conv_kernel is missing"):
        deltanet_shape(FakeFile(**keys))
    with pytest.raises(GGUFError, match="unsupported DeltaNet geometry"):
        deltanet_shape(
            FakeFile(**{**keys, "ssm.conv_kernel": 4, "ssm.time_step_rank": 3, "ssm.inner_size": 24})
        )
    assert deltanet_shape(FakeFile(**keys, **{"ssm.conv_kernel": 4})).conv_dim == 2 * 16 + 32
