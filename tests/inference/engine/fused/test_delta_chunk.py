"""The chunked gated delta rule (fused/delta_chunk.py, kept off the serving path): the numba
kernel against its numpy reference, and both against the token-by-token recurrence within the
float32 bound the module documents (a different summation order, so not bitwise).

Measured on these inputs (outputs up to ~0.3, states up to ~1.2): the chunked outputs within
3e-7 of the recurrence's and the states within 5e-7, across chunk boundaries, at the synthetic
files', a released file's and an oblong geometry. The bound held here is 2e-6 on outputs and
4e-6 on states, a few units in the last place of the largest values.
"""

from __future__ import annotations

import numpy as np
import pytest

from inference.engine.fused.delta_chunk import delta_rule_chunked, delta_rule_chunked_reference
from inference.engine.models.deltanet import delta_rule
from tests.inference.engine.fused.test_delta_rule import GEOMETRIES, inputs
from tests.inference.engine.test_qwen35 import reference_delta_rule

OUT_BOUND = 2e-6
STATE_BOUND = 4e-6


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "x".join(map(str, g)))
@pytest.mark.parametrize("n, chunk", [(150, 64), (23, 8), (1, 64)])
def test_the_kernel_agrees_with_its_reference_and_the_recurrence(geometry, n, chunk):
    q, k, v, g, beta, start = inputs(np.random.default_rng(7), n, *geometry)
    state, ref_state, token_state = start.copy(), start.copy(), start.copy()
    out = delta_rule_chunked(q, k, v, g, beta, state, chunk)  # (n, Hv, head_v)
    ref = delta_rule_chunked_reference(q, k, v, g, beta, ref_state, chunk)
    token = delta_rule(q, k, v, g, beta, token_state)
    assert np.abs(out).max() > 0 and not np.array_equal(state, start)
    for got, got_state in ((out, state), (ref, ref_state)):
        assert np.abs(got - token).max() <= OUT_BOUND
        assert np.abs(got_state - token_state).max() <= STATE_BOUND


def test_strong_decays_underflow_to_zero_not_nan():
    # exp of a whole chunk's decay (here e^-3200) underflows; only differences of the running
    # sum are exponentiated, so nothing divides by it.
    q, k, v, g, beta, start = inputs(np.random.default_rng(3), 80, *GEOMETRIES[0])
    g = np.full_like(g, -50.0)  # (n, Hv)
    state, token_state = start.copy(), start.copy()
    out = delta_rule_chunked(q, k, v, g, beta, state)
    token = delta_rule(q, k, v, g, beta, token_state)
    assert np.isfinite(out).all() and np.isfinite(state).all()
    assert np.abs(out - token).max() <= OUT_BOUND and np.abs(state - token_state).max() <= STATE_BOUND


def test_the_kernel_matches_a_float64_reference():
    q, k, v, g, beta, start = inputs(np.random.default_rng(1), 70, *GEOMETRIES[0])
    state = start.copy()
    out = delta_rule_chunked(q, k, v, g, beta, state, 32)
    ref_out, ref_state = reference_delta_rule(q, k, v, g, beta, start)
    np.testing.assert_allclose(out, ref_out, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(state, ref_state, atol=2e-5, rtol=1e-4)
