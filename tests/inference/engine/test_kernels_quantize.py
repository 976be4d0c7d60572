"""The numba activation rounding (quants/quantize.py) against the numpy reference (activations.py).

Both must produce the very same float32 values: the whole point of rounding activations like
ggml is agreement with llama.cpp to float noise, so any difference here is a bug, not noise.
"""

from __future__ import annotations

import numpy as np
import pytest

from inference.engine.quants import activations
from inference.engine.quants.quantize import (
    ACT_NONE,
    ACT_Q8_0,
    ACT_Q8_1,
    ACT_Q8_K,
    round_activations,
    round_f16,
    round_row_int,
)


def _rows(n: int, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, cols)).astype(np.float32) * np.float32(3.0)  # (n, cols)
    x[0, :32] = 0.0  # an all-zero block
    x[1, 5] = 1e-6  # a block whose scale is an f16 subnormal
    x[1, 6:64] = 0.0
    x[2, 40] = -np.abs(x[2, 32:64]).max() * 2  # a negative extreme
    x[3, 64:96] = np.float32(0.5)  # ties in the maximum magnitude
    return x


def assert_bitwise_equal(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint32), b.astype(np.float32).view(np.uint32))


def test_round_f16_equals_numpy_float16():
    rng = np.random.default_rng(0)
    samples = np.concatenate(
        [
            rng.standard_normal(20000).astype(np.float32) * np.float32(10.0) ** rng.integers(-9, 5, 20000),
            np.array([0.0, -0.0, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 65504.0, 65520.0, 1e9, -1e-8], np.float32),
        ]
    ).astype(np.float32)
    got = np.array([round_f16(v) for v in samples], np.float32)
    with np.errstate(over="ignore"):  # 1e9 and 65520 overflow to inf, as they should
        expected = samples.astype(np.float16).astype(np.float32)
    assert_bitwise_equal(got, expected)


@pytest.mark.parametrize(
    "kind, reference", [(ACT_Q8_0, activations.round_q8_0), (ACT_Q8_1, activations.round_q8_1)]
)
def test_q8_32_rounding_equals_reference(kind, reference):
    x = _rows(5, 256, seed=kind)
    values, group_sums = round_activations(x, kind, 32)
    expected = reference(x)
    assert_bitwise_equal(values, expected.values)
    if kind == ACT_Q8_1:
        # Q8_1's stored sums s = f16(d * sum q): the reference keeps them as values + error.
        q, d, _ = activations._q8_blocks(x)
        assert_bitwise_equal(group_sums, activations._f16(d * q.sum(axis=-1)))


@pytest.mark.parametrize("group_size", [16, 32])
def test_q8_k_rounding_equals_reference(group_size):
    x = _rows(4, 512, seed=group_size)
    values, group_sums = round_activations(x, ACT_Q8_K, group_size)
    assert_bitwise_equal(values, activations.round_q8_k(x).values)
    expected_sums = values.reshape(4, -1, group_size).astype(np.float64).sum(axis=-1)
    np.testing.assert_allclose(group_sums, expected_sums, rtol=1e-6, atol=1e-6)


def test_no_rounding_passes_values_and_group_sums():
    x = _rows(4, 128, seed=9)
    values, group_sums = round_activations(x, ACT_NONE, 32)
    assert_bitwise_equal(values, x)
    np.testing.assert_allclose(group_sums, x.reshape(4, 4, 32).sum(axis=-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("kind", "group_size"), [(ACT_Q8_0, 32), (ACT_Q8_1, 32), (ACT_Q8_K, 16), (ACT_Q8_K, 32)]
)
def test_integer_rounding_gives_the_codes_their_scales_and_exact_group_sums(kind, group_size):
    """round_row_int (what the products take): the values round_row gives, integer codes and
    per-group scales whose products are those values, and Q8_K's group sums d * sum(q)."""
    x = _rows(5, 512, seed=kind + group_size)
    reference, _ = round_activations(x, kind, group_size)
    for row, expected in zip(x, reference, strict=True):
        values, ints = np.empty_like(row), np.empty(row.size, np.int8)  # (cols,) each
        scales = np.empty(row.size // group_size, np.float32)  # (groups,)
        sums = np.zeros(row.size // group_size, np.float32)  # (groups,)
        round_row_int(kind, row, values, ints, scales, sums, group_size, True)
        assert_bitwise_equal(values, expected)
        # As values (a code of 0 has no sign: -0.0 and 0.0 compare equal here)
        np.testing.assert_array_equal(ints.astype(np.float32) * np.repeat(scales, group_size), values)
        if kind == ACT_Q8_K:
            code_sums = ints.reshape(-1, group_size).astype(np.int64).sum(axis=-1).astype(np.float32)
            assert_bitwise_equal(sums, scales * code_sums)
