"""The fused one-call decoder layer (models/fused.py) against the numpy layer path (llama.py).

Both round every activation exactly as ggml does, so the first decode step agrees to the last
float32 bits. Later steps may not: numba's expf and numpy's SIMD exp differ in the last bit
for some inputs, and where that flips an int8 rounding the difference grows through the layers
(to ~2% of the largest logit on Qwen2.5, the size of llama.cpp's own batch-size spread). Those
steps are held to that noise level and the same greedy token, far below what a wrong weight,
bias, position or cache row does.
"""

from __future__ import annotations

import numpy as np
import pytest

from inference.engine.engine import Engine
from inference.engine.layers import gelu_tanh, rms_norm
from inference.engine.models.fused import apply_linear, gelu_tanh_f16, linear_spec, rms_norm_row
from inference.engine.quants import load_matrix
from tests.fixtures.model_files import default_model_path, optional_model_path
from tests.fixtures.synthetic_gguf import synthetic_path
from tests.inference.test_quants import Q, random_quant_bytes


def _decode_logits(engine: Engine, fused: bool) -> list[np.ndarray]:
    saved = engine.model.fused_layers
    engine.model.fused_layers = saved if fused else None
    try:
        cache = engine.new_cache(64)
        engine.prefill(cache, list(range(3, 20)))
        return [engine.decode_one(cache, 5 + step) for step in range(4)]
    finally:
        engine.model.fused_layers = saved


def test_fused_decode_equals_numpy_layers_on_synthetic_llama(synthetic_dir):
    # (The synthetic qwen2 has float matrices in every layer: those layers take the numpy path.)
    engine = Engine.load(synthetic_path("llama", synthetic_dir))
    assert any(args is not None for args in engine.model.fused_layers)
    _assert_agree(_decode_logits(engine, True), _decode_logits(engine, False))


@pytest.mark.parametrize("model", ["default", "qwen2.5-coder-0.5b-instruct.gguf", "gemma-3-270m-q4_k_m.gguf"])
def test_fused_decode_equals_numpy_layers_on_real_models(model):
    engine = Engine.load(default_model_path() if model == "default" else optional_model_path(model))
    assert all(args is not None for args in engine.model.fused_layers)
    _assert_agree(_decode_logits(engine, True), _decode_logits(engine, False))


def _assert_agree(fused_steps: list[np.ndarray], plain_steps: list[np.ndarray]) -> None:
    first_fused, first_plain = fused_steps[0], plain_steps[0]
    np.testing.assert_allclose(first_fused, first_plain, rtol=0, atol=1e-4 * np.abs(first_plain).max())
    for fused, plain in zip(fused_steps, plain_steps, strict=True):
        assert np.argmax(fused) == np.argmax(plain)
        np.testing.assert_allclose(fused, plain, rtol=0, atol=0.03 * np.abs(plain).max())


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q5_0, Q.Q4_K, Q.Q6_K])
def test_apply_linear_equals_matrix_matvec(qtype):
    rows, cols = 40, 512
    matrix = load_matrix(qtype, random_quant_bytes(qtype, rows, cols, 3), (rows, cols))
    x = np.random.default_rng(1).standard_normal(cols).astype(np.float32)
    bias = np.random.default_rng(2).standard_normal(rows).astype(np.float32)
    out = np.empty(rows, np.float32)
    apply_linear(linear_spec(matrix, bias), x, out)
    np.testing.assert_allclose(out, matrix.matvec(x, bias), rtol=1e-5, atol=1e-5)


def test_rms_norm_row_equals_layers_rms_norm():
    rng = np.random.default_rng(4)
    x = rng.standard_normal(576).astype(np.float32) * 7
    weight = rng.standard_normal(576).astype(np.float32)
    expected = rms_norm(x[None], weight, 1e-5)[0]
    np.testing.assert_array_equal(rms_norm_row(x, weight, np.float32(1e-5)), expected)


def test_gelu_tanh_f16_equals_layers_gelu_tanh():
    # Where gelu is nearly zero (x ~ -4 .. -10) 1 + tanh cancels, and the last-bit difference
    # between numba's tanhf and numpy's tanh shows as a few f16 steps of a ~1e-6 value.
    x = np.random.default_rng(7).standard_normal(4096).astype(np.float32) * 6  # reaches both clamps
    np.testing.assert_allclose(gelu_tanh_f16(x), gelu_tanh(x), rtol=2.0**-10, atol=1e-6)
