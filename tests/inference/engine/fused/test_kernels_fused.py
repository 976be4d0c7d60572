"""The fused one-region forward (fused/fused.py, step_kernels.py) against the numpy layer
path (each family's ``block``), from one shared prefilled cache.

Both round every activation exactly as ggml does and share the integer group dot products, so
they usually agree to float32 noise. Not always: float matrices go through BLAS on one side and
our loop on the other, small reductions are summed in different orders, and where a last-bit
difference flips an int8 rounding the difference grows through the layers (to ~2% of the
largest logit, the size of llama.cpp's own batch-size spread). So every step is held to that
noise level and the same greedy token (unless the reference nearly ties), far below what a
wrong weight, bias, position or cache row does.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

from inference.engine.engine import Engine
from inference.engine.fused import step_kernels as sk
from inference.engine.fused import step_products as sp
from inference.engine.fused.fused import FusedForward, LayerWeights
from inference.engine.fused.rowops import f16_bits, gelu_f16, gelu_tanh_f16, rms_norm_row
from inference.engine.jit import stage_calls
from inference.engine.kv_cache import KVCache
from inference.engine.models.layers import gelu_tanh, rms_norm
from inference.engine.quants import load_matrix
from tests.fixtures.model_files import default_model_path, optional_model_path
from tests.fixtures.synthetic_gguf import synthetic_path
from tests.inference.engine.test_quants import Q, random_quant_bytes


def _decode_logits(engine: Engine, fused: bool, prefilled: KVCache) -> list[np.ndarray]:
    """Four decode steps after the same prefilled cache, through the fused step or the numpy
    layers; then the cache rows the steps wrote."""
    saved = engine.model.fused
    engine.model.fused = saved if fused else None
    try:
        cache = engine.new_cache(64)
        cache.k[...], cache.v[...], cache.tokens = prefilled.k, prefilled.v, list(prefilled.tokens)
        logits = [engine.decode_one(cache, 5 + step) for step in range(4)]
        # What the step wrote into the cache is what the numpy path reads back.
        return logits + [cache.k[:, :, 17:21].ravel(), cache.v[:, :, 17:21].ravel()]
    finally:
        engine.model.fused = saved


def _fused_and_plain(engine: Engine) -> tuple[list[np.ndarray], list[np.ndarray]]:
    prefilled = engine.new_cache(64)
    engine.prefill(prefilled, list(range(3, 20)))
    return _decode_logits(engine, True, prefilled), _decode_logits(engine, False, prefilled)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_fused_decode_equals_numpy_layers_on_synthetic_models(arch, synthetic_dir):
    # Together these cover every quant format and F32/F16/BF16 in every slot, stacked and
    # separate q/k/v and gate/up, biases, q/k norms, post norms, GELU and sliding windows.
    engine = Engine.load(synthetic_path(arch, synthetic_dir))
    assert engine.model.fused is not None
    _assert_agree(*_fused_and_plain(engine))


def test_models_with_experts_keep_the_numpy_path(synthetic_dir):
    assert Engine.load(synthetic_path("qwen3moe", synthetic_dir)).model.fused is None


@pytest.mark.parametrize("model", ["default", "qwen2.5-coder-0.5b-instruct.gguf", "gemma-3-270m-q4_k_m.gguf"])
def test_fused_decode_equals_numpy_layers_on_real_models(model):
    engine = Engine.load(default_model_path() if model == "default" else optional_model_path(model))
    assert engine.model.fused is not None
    _assert_agree(*_fused_and_plain(engine))


def _assert_agree(fused_steps: list[np.ndarray], plain_steps: list[np.ndarray]) -> None:
    *fused_logits, fused_k, fused_v = fused_steps
    *plain_logits, plain_k, plain_v = plain_steps
    for fused, plain in zip(fused_logits, plain_logits, strict=True):
        noise = 0.03 * np.abs(plain).max()
        np.testing.assert_allclose(fused, plain, rtol=0, atol=noise)
        runner_up, best = np.sort(plain)[-2:]
        if best - runner_up > 2 * noise:  # the same greedy token, unless the reference nearly ties
            assert np.argmax(fused) == np.argmax(plain)
    for fused, plain in ((fused_k, plain_k), (fused_v, plain_v)):
        np.testing.assert_allclose(fused, plain, rtol=0, atol=0.03 * np.abs(plain).max())


FORMATS = [
    Q.Q4_0,
    Q.Q4_1,
    Q.Q5_0,
    Q.Q5_1,
    Q.Q8_0,
    Q.Q2_K,
    Q.Q3_K,
    Q.Q4_K,
    Q.Q5_K,
    Q.Q6_K,
    Q.F32,
    Q.F16,
    Q.BF16,
]


def _matrix(qtype, rows: int, cols: int, seed: int):
    if qtype in (Q.F32, Q.F16, Q.BF16):
        weights = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
        if qtype == Q.F16:
            return load_matrix(qtype, weights.astype(np.float16), (rows, cols))
        if qtype == Q.BF16:
            return load_matrix(
                qtype, (weights.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8), (rows, cols)
            )
        return load_matrix(qtype, weights, (rows, cols))
    return load_matrix(qtype, random_quant_bytes(qtype, rows, cols, seed), (rows, cols))


@pytest.mark.parametrize("tid", [0, 1])  # one row: thread 1 claims from the back, walks downward
@pytest.mark.parametrize("n_rows", [1, 5])
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_rows_stage_equals_matrix_matvec(qtype, n_rows, tid):
    # Two stacked linears of one format (70 + 45 rows: tiles straddle them) with a bias on the
    # second, for one row and for five (a block of four plus one), against each matrix's own
    # matvec of each row: bitwise for block formats, whose products are exact sums.
    cols, padded = 512, 8  # the kernel's rounded inputs come in whole blocks of rows
    first, second = _matrix(qtype, 70, cols, 3), _matrix(qtype, 45, cols, 4)
    bias = np.random.default_rng(2).standard_normal(45).astype(np.float32)
    layer = LayerWeights((first, second, *[None] * 5), (None, bias, *[None] * 5), (np.ones(8),) * 4, None)
    dims = np.array([1, 1, 8, 8, 0, 0], np.int64)
    head = _matrix(Q.Q8_0, 4, 32, 5)
    step = FusedForward([layer], dims, 1e-5, 1.0, head, np.ones(8, np.float32))
    weights, linears = step.model.weights, step.model.linears[0, 0:3]
    x = np.random.default_rng(1).standard_normal((n_rows, cols)).astype(np.float32)
    rounded = sk.Rounded(
        np.empty((3, padded, cols), np.float32),  # values
        np.zeros((3, padded, cols), np.int8),  # integer codes
        np.zeros((3, padded, cols // 16), np.float32),  # their scales
        np.zeros((3, padded, cols // 16), np.float32),  # group sums
    )
    # round_inputs rounds a float matrix's input through a pointer, and the float products are
    # compiled only for a model with float matrices (step.features): both prepared first
    stage_calls.prepare(sk.round_inputs, (linears, x[0], rounded, 0), step.features)
    for n in range(n_rows):
        sk.round_inputs(linears, x[n], rounded, n)
    out = np.full((n_rows, 115), np.nan, np.float32)
    counters = (np.zeros(1, np.int64), np.zeros(1, np.int64))
    args = (weights, linears, rounded, n_rows, out, False, counters, 0, tid)
    stage_calls.prepare(sp.rows_stage, args, step.features)  # its products are pointer calls of dot_run
    sp.rows_stage(*args)
    expected = np.stack([np.concatenate([first.matvec(row), second.matvec(row, bias)]) for row in x])
    if qtype in (Q.F32, Q.F16, Q.BF16):
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)
    else:
        np.testing.assert_array_equal(out, expected)
    assert counters[1][0] == 4  # every tile of 32 rows claimed and done once


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


@numba.njit(cache=True)
def _scalar_gelu_and_bits(x):
    values, bits = np.empty_like(x), np.empty(x.shape[0], np.uint16)  # (n,), (n,)
    raw = x.view(np.uint32)
    for i in range(x.shape[0]):
        values[i], bits[i] = gelu_f16(x[i]), f16_bits(x[i], raw[i])
    return values, bits


def test_gelu_table_equals_the_scalar_gelu_and_f16_bits_equal_numpy():
    rng = np.random.default_rng(3)
    x = np.concatenate(
        [
            rng.standard_normal(200_000) * 4,  # both clamps and the whole f16 normal range used
            rng.standard_normal(20_000) * 1e-5,  # f16 subnormals
            [0.0, -0.0, 9.9990, -9.9990, 10.0, -10.0, 2.0**-14, -(2.0**-25), 65000.0],
        ]
    ).astype(np.float32)
    scalar, bits = _scalar_gelu_and_bits(x)
    np.testing.assert_array_equal(bits, x.astype(np.float16).view(np.uint16))
    np.testing.assert_array_equal(gelu_tanh_f16(x[None])[0], scalar)
