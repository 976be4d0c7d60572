"""Gemma 4 on its synthetic files: the bytes llama.cpp was recorded on, the per-layer geometry
read from the metadata, path invariance (the same checks as test_invariance.py, which covers
the other families), the sliding window, the softcap, and what the family adds for serving.
Fidelity against llama.cpp itself is in test_fidelity.py (goldens generation_synthetic-gemma4*)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from inference.engine.engine import Engine
from inference.engine.gguf_file import GGUFError
from inference.engine.models.gemma4_ple import PerLayerInject, PerLayerInputs
from inference.engine.models.gemma4_shapes import layer_shapes
from tests.fixtures.synthetic_gemma4 import SPECS, gemma4_path
from tests.inference.engine.test_invariance import (  # noqa: F401  (collected here with this module's engine)
    test_lockstep_batch_rows_equal_their_own_decode,
    test_mixed_runs_in_one_forward_equal_separate_forwards,
    test_prefill_chunks_equal_one_token_decode,
    test_verify_rows_and_truncation_equal_decode,
)

# The invariance checks on four gemma4 geometries take ~50 s on two cores: the slow tier.
pytestmark = pytest.mark.slow

GOLDENS_DIR = Path(__file__).resolve().parents[2] / "goldens"
NARROW_WINDOW = 8  # shorter than test_invariance's 24 tokens, so the window slides there


def with_window(engine: Engine, window: int) -> Engine:
    """The same weights with another sliding window (the layers read it from the config)."""
    model = engine.model
    model.config = dataclasses.replace(model.config, sliding_window=window)
    return engine


@pytest.fixture(scope="module", params=["gemma4", "gemma4-moe", "gemma4-ple", "gemma4-narrow-window"])
def engine(request, synthetic_dir) -> Engine:
    name = request.param.removesuffix("-narrow-window")
    loaded = Engine.load(gemma4_path(name, synthetic_dir))
    return with_window(loaded, NARROW_WINDOW) if request.param.endswith("-narrow-window") else loaded


@pytest.mark.parametrize("name", list(SPECS))
def test_bytes_match_the_file_llama_cpp_was_recorded_on(name, synthetic_dir):
    path = gemma4_path(name, synthetic_dir)
    golden = json.loads((GOLDENS_DIR / f"generation_synthetic-{name}.json").read_text(encoding="utf-8"))
    assert path.name == golden["model_file"] and golden["synthetic_arch"] == name
    assert hashlib.sha256(path.read_bytes()).hexdigest() == golden["sha256"]


def test_layer_geometry_follows_the_metadata(synthetic_dir):
    model = Engine.load(gemma4_path("gemma4", synthetic_dir)).model
    spec = SPECS["gemma4"]
    shapes = model.shapes
    assert [s.local for s in shapes] == list(spec.local)
    assert [s.n_kv_heads for s in shapes] == list(spec.kv_heads)
    assert [s.head_dim for s in shapes] == [spec.head_local if lo else spec.head_global for lo in spec.local]
    assert [s.rope_base for s in shapes] == [20000.0 if lo else 1000000.0 for lo in spec.local]
    # The two shared-kv layers read the last own-cache layer of their kind (llama.cpp's rule).
    assert [s.kv_layer for s in shapes] == [-1, -1, -1, -1, 2, 3]
    assert "attn_v" not in model.layers[3] and "attn_k" not in model.layers[4]
    geometry = model.config.kv_geometry  # the widest layer's rows hold every layer's
    assert (geometry.n_kv_heads, geometry.head_dim_k) == (2, spec.head_global)


def test_per_layer_embeddings_and_widths_follow_the_file(synthetic_dir):
    engine = Engine.load(gemma4_path("gemma4-ple", synthetic_dir))
    model, spec = engine.model, SPECS["gemma4-ple"]
    assert (
        model.ple_width == spec.n_ple and model.per_layer_inputs.tok_embd.cols == spec.n_layers * spec.n_ple
    )
    assert [w["ffn_gate"].rows for w in model.layers] == list(spec.n_ff_layers)
    tokens = [2, 818, 63937, 64222, 1234]
    inputs = model.per_layer_inputs(np.array(tokens), model.embed(np.array(tokens)), model.config.norm_eps)
    assert inputs.shape == (spec.n_layers, len(tokens), spec.n_ple)
    with_ple = engine.verify(engine.new_cache(8), tokens)  # (5, vocab)
    model.per_layer_inputs = None  # the same layers without their per-layer rows (a fresh load)
    without = engine.verify(engine.new_cache(8), tokens)
    # Each position's logits move (the per-layer rows reach every layer's residual stream).
    assert all(np.abs(with_ple[i] - without[i]).max() > 0.1 for i in range(len(tokens)))


def test_logits_are_soft_capped(synthetic_dir):
    engine = Engine.load(gemma4_path("gemma4", synthetic_dir))
    logits = engine.verify(engine.new_cache(16), [2, 818, 63937, 64222])  # (4, vocab)
    assert np.abs(logits).max() < SPECS["gemma4"].softcap
    assert np.abs(logits).max() > 10  # the cap bends, it does not flatten


def test_the_sliding_window_limits_local_layers(synthetic_dir):
    tokens = np.random.default_rng(3).integers(3, 5000, 20).tolist()
    wide = Engine.load(gemma4_path("gemma4", synthetic_dir))
    narrow = with_window(Engine.load(gemma4_path("gemma4", synthetic_dir)), NARROW_WINDOW)
    a, b = wide.verify(wide.new_cache(24), tokens), narrow.verify(narrow.new_cache(24), tokens)
    # Up to the window's length every key is inside both windows; after it, the local layers
    # of the narrow one see fewer keys.
    assert np.array_equal(a[:NARROW_WINDOW], b[:NARROW_WINDOW])
    assert all(not np.array_equal(a[i], b[i]) for i in range(NARROW_WINDOW, len(tokens)))


def test_family_serving_facts(synthetic_dir):
    engine = Engine.load(gemma4_path("gemma4", synthetic_dir))
    vocab = engine.tokenizer
    assert {vocab.token_id("<turn|>"), vocab.token_id("<eos>")} <= engine.stop_ids
    sampling = engine.recommended_sampling()  # the file's general.sampling.* keys
    assert (sampling.temperature, sampling.top_k) == (1.0, 64)
    text = engine.render_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert text.endswith(
        "<|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
    )


class FakeFile:
    """Just the metadata layer_shapes reads."""

    path, architecture = "fake.gguf", "gemma4"

    def __init__(self, **values):
        self.values = {
            "attention.sliding_window_pattern": np.array([True, False, True, False]),
            "attention.head_count_kv": 2,
            "attention.key_length": 128,
            "attention.key_length_swa": 64,
            **values,
        }

    def arch_value(self, key, default=None):
        return self.values.get(key, default)

    def has_tensor(self, name):
        return False


def test_metadata_errors_name_the_problem():
    with pytest.raises(GGUFError, match="sliding_window_pattern is missing"):
        layer_shapes(FakeFile(**{"attention.sliding_window_pattern": None}), 4)
    with pytest.raises(GGUFError, match="head_count_kv has 3 entries for 4 layers"):
        layer_shapes(FakeFile(**{"attention.head_count_kv": np.array([2, 2, 2])}), 4)
    with pytest.raises(GGUFError, match="shared-kv layer 3 would read layer 2, not one of its kind"):
        layer_shapes(FakeFile(**{"attention.shared_kv_layers": 1}), 4)  # layer 2 is local, 3 global
    with pytest.raises(GGUFError, match="value_length differs"):
        layer_shapes(FakeFile(**{"attention.value_length": 64}), 4)
    scalar = layer_shapes(FakeFile(**{"attention.sliding_window_pattern": 2}), 4)  # every 2nd global
    assert [s.local for s in scalar] == [True, False, True, False]


class TensorFile:
    """Just the tensors the per-layer embedding loader reads, all of the given shape."""

    path = "fake.gguf"

    def __init__(self, shape):
        self.shape = shape

    def tensor(self, name):
        return SimpleNamespace(name=name, shape=self.shape, type=0, data=np.zeros(self.shape, np.float32))


def test_per_layer_embedding_shapes_are_checked():
    with pytest.raises(
        GGUFError, match=r"per_layer_token_embd.weight has shape \(10, 383\), expected \(10, 384\)"
    ):
        PerLayerInputs(TensorFile((10, 383)), n_layers=6, n_embd=256, width=64, vocab=10)
    with pytest.raises(GGUFError, match=r"blk.2.inp_gate.weight has shape \(64, 255\), expected \(64, 256\)"):
        PerLayerInject(TensorFile((64, 255)), 2, n_embd=256, width=64)
