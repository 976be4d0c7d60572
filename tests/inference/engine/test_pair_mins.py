"""dot_pair_min (quants/pair_mins.py): the min terms folded into the dot product's loop give
the bits of the dot products and min_sums_pair run one after the other, in every selection."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from inference.engine.jit.simd import SELECTIONS, missing_features, target_features
from inference.engine.quants import intdot, nibbles, pair_mins
from inference.engine.quants.intdot import min_sum, min_sums_pair
from inference.engine.quants.intdot_reference import dot_row_bitwise_reference, fma_float32
from inference.engine.quants.nibbles import NIBBLE_OFFSET, pack_nibbles


@numba.njit(cache=True)
def _separate_and_folded(q, start, ints, scales, int_scales, mins, sums, n_groups, shift, nib, pair, folded):
    """[pair dot + min_sums_pair added, folded pair] for weight rows 0 and 1."""
    out = np.zeros((2, 2), np.float32)  # (variant, weight row)
    dots, min_terms = np.empty(2, np.float32), np.empty(2, np.float32)
    if nib >= 0:
        pair(q, 0, start, ints, scales, 0, n_groups, int_scales, n_groups, nib, dots)
    else:
        pair(q, 0, start, ints, scales, 0, n_groups, int_scales, n_groups, shift, dots)
    min_sums_pair(mins, 0, n_groups, sums, n_groups, min_terms)
    for i in range(2):
        acc = dots[i]
        acc += min_terms[i]
        out[0, i] = acc
    folded(
        q,
        0,
        start,
        ints,
        scales,
        0,
        n_groups,
        int_scales,
        mins,
        0,
        n_groups,
        sums,
        n_groups,
        shift,
        nib,
        out[1],
    )
    return out


def _reference(q, ints, scales, int_scales, mins, sums) -> np.float32:
    """dot_row_bitwise_reference plus the min chain, each FMA rounded once."""
    chain = np.float32(0.0)
    for m, s in zip(mins, sums, strict=True):
        chain = fma_float32(m, s, chain)
    return np.float32(dot_row_bitwise_reference(q, ints, scales, int_scales) + chain)


@pytest.mark.parametrize("simd", SELECTIONS)
@pytest.mark.parametrize("layout", ["int16", "int32", "nib0", "nib8"])
def test_folded_min_terms_give_the_bits_of_the_separate_chain(simd, layout):
    missing = missing_features(simd, target_features())
    if missing:
        pytest.skip(f"the CPU lacks {', '.join(missing)} for the {simd} selection")
    rng = np.random.default_rng(len(layout))
    cols = 512
    shift, nib = (4, -1) if layout == "int16" else (5, -1 if layout == "int32" else int(layout[3:]))
    n_groups = cols >> shift
    if nib < 0:
        q = rng.integers(-128, 128, (2, cols)).astype(np.int8)
        q[0, :64] = -128
        weights, pair = q.ravel(), intdot.SELECTED[simd][2]
    else:
        q = (rng.integers(0, 16, (2, cols)) - nib).astype(np.int8)
        q[0, :32], q[1, :32] = -nib, 15 - nib
        weights, pair = pack_nibbles(q, nib).view(np.int8).ravel(), nibbles.SELECTED[simd][2]
    ints = rng.integers(-127, 128, cols).astype(np.int8)
    ints[:32] = 127
    scales = rng.standard_normal((2, n_groups)).astype(np.float32)
    mins = rng.standard_normal((2, n_groups)).astype(np.float32)
    int_scales, sums = (
        rng.random(n_groups, dtype=np.float32),
        rng.standard_normal(n_groups).astype(np.float32),
    )
    start = weights.size // 2
    out = _separate_and_folded(
        weights,
        start,
        ints,
        scales.ravel(),
        int_scales,
        mins.ravel(),
        sums,
        n_groups,
        shift,
        nib,
        pair,
        pair_mins.SELECTED[simd],
    )
    np.testing.assert_array_equal(out[1], out[0])
    expected = [_reference(q[r], ints, scales[r], int_scales, mins[r], sums) for r in range(2)]
    np.testing.assert_array_equal(out[1], np.array(expected, np.float32))
    assert min_sum(mins.ravel(), n_groups, sums, n_groups) + 0 == min_sum(mins[1], 0, sums, n_groups)


def test_nibble_offset_is_eight():
    assert NIBBLE_OFFSET == 8  # pair_mins takes any positive nib as the offset-8 variant
