"""Each numba kernel of inference.engine.quants against its plain numpy reference.

Tolerance of the products: the kernels sum in float32 in any order (fastmath), the references
in float64. Rounding error of a float32 sum of n terms is at most about n * 2**-24 times the
sum of the terms' magnitudes, and the terms are bounded by (|q * scale| + |min|) * |x|. The
tests allow 2 * cols * 2**-24 times that magnitude: a wrong value, index or scale is off by
orders of magnitude more.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import gguf
import numpy as np
import pytest

from inference.engine.quants import load_matrix
from inference.engine.quants.dequant import dequantize_rows
from inference.engine.quants.layout import dequantize_reference
from inference.engine.quants.matmul import matmul
from inference.engine.quants.matvec import matvec, matvec_reference
from inference.engine.quants.quantize import ACTIVATION_KIND
from tests.inference.engine.test_quants import BLOCK_TYPES, assert_bitwise_equal, random_quant_bytes

Q = gguf.GGMLQuantizationType
UNIT_ROUNDOFF = 2.0**-24


def _layout(qtype: Q, rows: int, cols: int, seed: int = 0):
    return load_matrix(qtype, random_quant_bytes(qtype, rows, cols, seed), (rows, cols)).layout


def _magnitude(layout) -> np.ndarray:
    """(rows, cols) float64 bound on |q * scale| + |min| per weight."""
    g = layout.group_size
    rows, cols = layout.q.shape
    scaled = np.abs(layout.q.astype(np.float64).reshape(rows, -1, g) * layout.scales[:, :, None])
    if layout.mins is not None:
        scaled += np.abs(layout.mins[:, :, None])
    return scaled.reshape(rows, cols)


def _assert_within_sum_bound(got: np.ndarray, reference: np.ndarray, bound_terms: np.ndarray, cols: int):
    bound = 2 * cols * UNIT_ROUNDOFF * bound_terms + 1e-30
    excess = np.abs(got.astype(np.float64) - reference) - bound
    assert excess.max() <= 0, f"worst error exceeds the bound by {excess.max():.3g}"


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_gather_kernel_equals_numpy_reference_bitwise(qtype):
    layout = _layout(qtype, 7, 512, seed=11)
    for ids in (np.array([6, 0, 2, 2]), np.array([6, 0, 2, 2, 5, 1, 3, 4, 0, 6])):  # serial, parallel
        assert_bitwise_equal(dequantize_rows(layout, ids), dequantize_reference(layout, ids))


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_matvec_kernel_agrees_with_reference(qtype):
    rows, cols = 37, 768  # rows not a multiple of the thread count; cols of several groups
    layout = _layout(qtype, rows, cols, seed=int(qtype))
    x = np.random.default_rng(5).standard_normal(cols).astype(np.float32)
    kind = ACTIVATION_KIND[qtype]
    got = matvec(layout, x, kind)
    assert got.shape == (rows,) and got.dtype == np.float32
    _assert_within_sum_bound(got, matvec_reference(layout, x, kind), _magnitude(layout) @ np.abs(x), cols)


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tokens", [2, 3, 8])
def test_matmul_rows_are_matvecs_bitwise_and_agree_with_reference(qtype, n_tokens):
    # Each row of a product is the one-row product of that row, bit for bit: a token's result
    # does not depend on how many tokens are multiplied with it.
    rows, cols = 13, 512
    layout = _layout(qtype, rows, cols, seed=int(qtype) + n_tokens)
    x = np.random.default_rng(n_tokens).standard_normal((n_tokens, cols)).astype(np.float32)
    kind = ACTIVATION_KIND[qtype]
    got = matmul(layout, x, kind)
    assert got.shape == (n_tokens, rows) and got.dtype == np.float32
    np.testing.assert_array_equal(got, np.stack([matvec(layout, row, kind) for row in x]))
    for row, result in zip(x, got):
        _assert_within_sum_bound(
            result, matvec_reference(layout, row, kind), _magnitude(layout) @ np.abs(row), cols
        )


def test_matrix_products_route_to_the_kernels():
    rows, cols = 10, 256
    matrix = load_matrix(Q.Q4_1, random_quant_bytes(Q.Q4_1, rows, cols, 4), (rows, cols))
    kind = ACTIVATION_KIND[Q.Q4_1]
    x = np.random.default_rng(6).standard_normal((5, cols)).astype(np.float32)
    np.testing.assert_array_equal(matrix.matmul(x), matmul(matrix.layout, x, kind))
    np.testing.assert_array_equal(matrix.matvec(x[0]), matvec(matrix.layout, x[0], kind))
    # Any number of rows gives each row's matvec; zero rows give an empty result.
    np.testing.assert_array_equal(matrix.matmul(x[:1]), matvec(matrix.layout, x[0], kind)[None])
    np.testing.assert_array_equal(matrix.matmul(x), np.stack([matvec(matrix.layout, r, kind) for r in x]))
    assert matrix.matmul(x[:0]).shape == (0, rows)
    with pytest.raises(ValueError, match="shape"):
        matrix.matvec(x[0, :-1])
    with pytest.raises(ValueError, match="shape"):
        matrix.matmul(x[:, :-1])


def test_real_matrix_products_agree_with_reference():
    # SmolLM2's own ffn_up shape and a K-quant with 16-weight groups, at realistic sizes.
    for qtype, rows, cols in [(Q.Q4_1, 1536, 576), (Q.Q6_K, 256, 2048)]:
        layout = _layout(qtype, rows, cols, seed=rows)
        x = np.random.default_rng(rows).standard_normal((4, cols)).astype(np.float32)
        terms = np.abs(x).astype(np.float64) @ _magnitude(layout).T
        kind = ACTIVATION_KIND[qtype]
        _assert_within_sum_bound(
            matvec(layout, x[0], kind)[None], matvec_reference(layout, x[0], kind)[None], terms[:1], cols
        )
        expected = np.stack([matvec_reference(layout, row, kind) for row in x])
        _assert_within_sum_bound(matmul(layout, x, kind), expected, terms, cols)


def test_kernels_are_cached_on_disk():
    """A fresh interpreter loads every kernel variant it uses from numba's cache, compiling nothing."""
    layout = _layout(Q.Q4_1, 8, 64)
    dequantize_rows(layout, np.arange(8))
    matvec(layout, np.ones(64, np.float32), ACTIVATION_KIND[Q.Q4_1])
    matmul(
        layout, np.ones((3, 64), np.float32), ACTIVATION_KIND[Q.Q4_1]
    )  # compiled (or loaded) and saved by now
    script = textwrap.dedent(
        """
        import numpy as np, gguf
        from inference.engine.quants import load_matrix
        from inference.engine.quants.dequant import gather_kernel
        from inference.engine.quants.matmul import matrows_kernel
        from inference.engine.quants.quantize import ACT_Q8_1
        from tests.inference.engine.test_quants import random_quant_bytes
        qtype = gguf.GGMLQuantizationType.Q4_1
        m = load_matrix(qtype, random_quant_bytes(qtype, 8, 64), (8, 64))
        m.dequantize(); m.matvec(np.ones(64, np.float32)); m.matmul(np.ones((3, 64), np.float32))
        for k in (gather_kernel(5, True), matrows_kernel(5, True, ACT_Q8_1)):
            print(sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values()))
        """
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = {**os.environ, "PYTHONPATH": root}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=root)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split()
    assert len(lines) == 4, result.stdout
    for hits, misses in zip(lines[::2], lines[1::2], strict=True):
        assert int(hits) >= 1 and int(misses) == 0, result.stdout
