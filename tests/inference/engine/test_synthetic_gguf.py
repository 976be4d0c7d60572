"""The synthetic GGUF models are byte-for-byte what llama.cpp was recorded on, and well formed.

``tests/goldens/generation_synthetic-<arch>.json`` (written by ``scripts/record_goldens.py``)
holds the sha256 of the file llama.cpp ran; if the generator's bytes drift, every fidelity
golden for that model is void, and this test says so.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from inference.engine.gguf_file import GGUFFile
from inference.engine.quants import SUPPORTED_TYPES
from tests.fixtures.synthetic_gguf import (
    SPECS,
    SYNTHETIC_ARCHS,
    expected_tensor_types,
    matrix_shapes,
    random_kquant,
    synthetic_path,
    tokenizer_source_path,
    uniform,
)

GOLDENS_DIR = Path(__file__).resolve().parents[2] / "goldens"
ALL_MATRIX_TYPES = SUPPORTED_TYPES  # every type the engine loads is in some synthetic matrix


def golden(arch: str) -> dict:
    return json.loads((GOLDENS_DIR / f"generation_synthetic-{arch}.json").read_text(encoding="utf-8"))


def is_matrix(name: str) -> bool:
    return name.endswith(".weight") and "norm" not in name


@pytest.mark.parametrize("arch", SYNTHETIC_ARCHS)
def test_bytes_match_the_file_llama_cpp_was_recorded_on(arch, synthetic_dir):
    path = synthetic_path(arch, synthetic_dir)
    recorded = golden(arch)
    assert path.name == recorded["model_file"], "GENERATOR_VERSION changed: re-record the goldens"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == recorded["sha256"]


@pytest.mark.parametrize("arch", SYNTHETIC_ARCHS)
def test_file_has_the_architecture_and_tensor_types_of_its_spec(arch, synthetic_dir):
    f = GGUFFile(synthetic_path(arch, synthetic_dir))
    spec = SPECS[arch]
    assert f.architecture == spec.arch
    assert {name: t.type for name, t in f.tensors.items()} == expected_tensor_types(arch)
    assert f.arch_value("block_count") == spec.n_layers
    assert f.arch_value("attention.head_count_kv") == spec.n_kv_heads < spec.n_heads
    vocab = len(f.metadata["tokenizer.ggml.tokens"])
    assert f.tensor("token_embd.weight").shape == (vocab, spec.n_embd)
    assert f.has_tensor("output.weight") == (spec.output is not None)
    for role, shape in matrix_shapes(spec).items():
        assert f.tensor(f"blk.0.{role}.weight").shape == shape
    for name, tensor in f.tensors.items():
        if not is_matrix(name):
            assert tensor.type == Q.F32, name


@pytest.mark.parametrize("arch", SYNTHETIC_ARCHS)
def test_tokenizer_metadata_is_the_source_models(arch, synthetic_dir):
    synthetic = GGUFFile(synthetic_path(arch, synthetic_dir)).metadata
    source = GGUFFile(tokenizer_source_path(SPECS[arch].tokenizer_source)).metadata
    keys = [k for k in source if k.startswith("tokenizer.")]
    assert keys == [k for k in synthetic if k.startswith("tokenizer.")]
    for key in keys:
        if isinstance(source[key], np.ndarray):
            assert source[key].dtype == synthetic[key].dtype and np.array_equal(source[key], synthetic[key])
        else:
            assert type(source[key]) is type(synthetic[key]) and source[key] == synthetic[key], key


def test_arch_specific_layout():
    assert "blk.0.attn_q.bias" in expected_tensor_types("qwen2")
    assert "blk.0.attn_q_norm.weight" in expected_tensor_types("qwen3")
    assert "blk.0.attn_q_norm.weight" not in expected_tensor_types("llama")
    gemma = expected_tensor_types("gemma3")
    assert {"blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight"} <= set(gemma)
    # llama.cpp makes every sixth layer global: the model must have one.
    assert SPECS["gemma3"].n_layers >= 6
    moe = matrix_shapes(SPECS["qwen3moe"])
    assert moe["ffn_gate_exps"] == (8, 256, 256) and moe["ffn_down_exps"] == (8, 256, 256)
    assert moe["ffn_gate_inp"] == (8, 256)


def test_every_quant_type_appears_in_some_matrix():
    seen = {
        qtype
        for arch in SYNTHETIC_ARCHS
        for name, qtype in expected_tensor_types(arch).items()
        if is_matrix(name)
    }
    assert seen == ALL_MATRIX_TYPES


@pytest.mark.parametrize("qtype", [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K])
def test_random_k_quant_blocks_dequantize_to_the_requested_spread(qtype):
    blocks = random_kquant(np.random.default_rng(7), qtype, 2048, std=0.05)
    assert blocks.shape == (2048, gguf.GGML_QUANT_SIZES[qtype][1])
    values = gguf.quants.dequantize(blocks, qtype)  # (2048, 256)
    assert abs(values.std() - 0.05) < 0.005
    assert abs(values.mean()) < 0.005
    assert np.abs(values).max() < 0.05 * 5


def test_uniform_values_are_exact_and_reproducible():
    a = uniform(np.random.default_rng([1, 2]), (4096,), std=0.1, mean=1.0)  # (4096,)
    b = uniform(np.random.default_rng([1, 2]), (4096,), std=0.1, mean=1.0)  # (4096,)
    assert a.dtype == np.float32 and np.array_equal(a, b)
    assert abs(a.mean() - 1.0) < 0.01 and abs(a.std() - 0.1) < 0.005


def test_synthetic_path_writes_once(tmp_path, monkeypatch):
    import tests.fixtures.synthetic_gguf as module

    calls = []

    def fake_write(arch, path):
        calls.append(arch)
        Path(path).write_bytes(b"GGUF")
        return path

    monkeypatch.setattr(module, "write_synthetic", fake_write)
    first = synthetic_path("llama", tmp_path)
    second = synthetic_path("llama", tmp_path)
    assert first == second and first.read_bytes() == b"GGUF" and calls == ["llama"]
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no partial file left behind
