"""The numba gated delta rule (fused/delta_rule.py) against its numpy reference
(models/deltanet.py's delta_rule_reference), and its path invariance.

The bound is zero: both run the same float32 operations in the same order (each sum over the
key index in index order, no FMA, no reassociation), so outputs and state must be bitwise
equal, on the synthetic files' geometry and on a released Qwen3.5's (16 key heads tiled over 32
value heads of 128). Invariance: a run of n tokens in one call, in random pieces, or one token
at a time gives the same bits (the kernel carries the next token's decay inside a call and
not across calls, so the cuts are where a fold could show).
"""

from __future__ import annotations

import numpy as np
import pytest

from inference.engine.models.deltanet import delta_rule, delta_rule_reference, l2_norm, sigmoid, softplus

# (n_k, n_v, head_k, head_v): the synthetic files, a released file, and an oblong state (the
# family refuses head_k != head_v, but the kernel's indexing must not confuse the two axes).
GEOMETRIES = [(2, 4, 32, 32), (16, 32, 128, 128), (2, 6, 16, 24)]


def inputs(rng: np.random.Generator, n: int, n_k: int, n_v: int, head_k: int, head_v: int) -> tuple:
    """q, k (l2-normed), v, g, beta and a start state drawn as the model makes them."""
    q = l2_norm(rng.normal(size=(n, n_k, head_k)).astype(np.float32), 1e-6)  # (n, Hk, head_k)
    k = l2_norm(rng.normal(size=(n, n_k, head_k)).astype(np.float32), 1e-6)  # (n, Hk, head_k)
    v = rng.normal(size=(n, n_v, head_v)).astype(np.float32)  # (n, Hv, head_v)
    g = (softplus(rng.normal(-2, 1, (n, n_v))) * -rng.uniform(1, 8, n_v)).astype(np.float32)  # (n, Hv)
    beta = sigmoid(rng.normal(size=(n, n_v)))  # (n, Hv)
    start = rng.normal(0, 0.3, (n_v, head_k, head_v)).astype(np.float32)  # (Hv, head_k, head_v)
    return q, k, v, g, beta, start


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "x".join(map(str, g)))
def test_the_kernel_equals_the_numpy_reference_bitwise(geometry):
    q, k, v, g, beta, start = inputs(np.random.default_rng(7), 23, *geometry)
    state, ref_state = start.copy(), start.copy()
    out = delta_rule(q, k, v, g, beta, state)
    ref = delta_rule_reference(q, k, v, g, beta, ref_state)
    assert np.abs(out).max() > 0 and not np.array_equal(state, start)
    assert np.array_equal(out, ref) and np.array_equal(state, ref_state)


@pytest.mark.parametrize("geometry", GEOMETRIES[:2], ids=lambda g: "x".join(map(str, g)))
def test_the_kernel_is_chunk_invariant_bitwise(geometry):
    rng = np.random.default_rng(11)
    n = 40
    q, k, v, g, beta, start = inputs(rng, n, *geometry)
    whole_state = start.copy()
    whole = delta_rule(q, k, v, g, beta, whole_state)  # (n, Hv, head_v)
    cuts = np.sort(rng.choice(np.arange(1, n), 5, replace=False)).tolist()
    # random pieces (with an empty one); one token at a time
    for bounds in ([0, 0, *cuts, n], list(range(n + 1))):
        state = start.copy()
        parts = [delta_rule(*(x[a:b] for x in (q, k, v, g, beta)), state) for a, b in zip(bounds, bounds[1:])]
        assert np.array_equal(np.concatenate(parts), whole) and np.array_equal(state, whole_state)
