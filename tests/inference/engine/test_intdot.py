"""The integer group dot product (quants/intdot.py) against its numpy references (within a
bound, and bit for bit), in every instruction selection (simd.py) the CPU can run, and the
integer codes of activation rounding against the float values they stand for."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from inference.engine.jit.simd import SELECTIONS, missing_features, target_features
from inference.engine.quants import intdot, nibbles
from inference.engine.quants.intdot import dot_row_int, dot_row_reference
from inference.engine.quants.intdot_reference import dot_row_bitwise_reference, round_to_float32
from inference.engine.quants.nibbles import (
    NIBBLE_OFFSET,
    pack_nibbles,
    packable_offset,
    unpack_nibbles,
)
from inference.engine.quants.quantize import ACT_Q8_0, ACT_Q8_1, ACT_Q8_K, round_row_int

# The generic selection's kernels, as globals the numba helpers below call.
generic_row_int, generic_rows_int = intdot.SELECTED["generic"].row, intdot.SELECTED["generic"].rows
generic_row_nib, generic_rows_nib = nibbles.SELECTED["generic"].row, nibbles.SELECTED["generic"].rows


def _runnable(simd: str) -> str:
    """``simd``, skipping the test with the features the CPU lacks for it."""
    missing = missing_features(simd, target_features())
    if missing:
        pytest.skip(f"the CPU lacks {', '.join(missing)} for the {simd} selection")
    return simd


@numba.njit(cache=True)
def _dot(q, q_start, ints, scales, s_start, int_scales, n_groups, group_shift):
    return dot_row_int(q, q_start, ints, scales, s_start, int_scales, n_groups, group_shift)


@pytest.mark.parametrize("group_shift", [4, 5])
def test_dot_row_int_equals_reference(group_shift):
    rng = np.random.default_rng(group_shift)
    group, cols = 1 << group_shift, 896
    q = rng.integers(-128, 128, 3 * cols, dtype=np.int8)  # three rows, the middle one used
    ints = rng.integers(-127, 128, cols).astype(np.int8)
    scales = rng.standard_normal(3 * cols // group).astype(np.float32)
    int_scales = rng.random(cols // group, dtype=np.float32)
    got = _dot(q, cols, ints, scales, cols // group, int_scales, cols // group, group_shift)
    expected = dot_row_reference(
        q[cols : 2 * cols], ints, scales[cols // group : 2 * cols // group], int_scales
    )
    bound = 2 * (cols // group) * 2.0**-24 * (np.abs(scales).max() * int_scales.max() * 127 * 128 * cols)
    assert abs(got - expected) <= bound
    # The extremes of the codes: every product exactly representable, sums exact in int32.
    ones = np.ones(cols // group, np.float32)
    extreme = _dot(
        np.full(cols, -128, np.int8),
        0,
        np.full(cols, 127, np.int8),
        ones,
        0,
        ones,
        cols // group,
        group_shift,
    )
    assert extreme == -128 * 127 * cols


@pytest.mark.parametrize("kind", [ACT_Q8_0, ACT_Q8_1, ACT_Q8_K])
@pytest.mark.parametrize("group", [16, 32])
def test_integer_codes_reproduce_the_rounded_values(kind, group):
    x = (np.random.default_rng(kind).standard_normal(512) * 3).astype(np.float32)
    values, ints = np.empty(512, np.float32), np.empty(512, np.int8)
    int_scales, sums = np.empty(512 // group, np.float32), np.zeros(512 // group, np.float32)
    round_row_int(kind, x, values, ints, int_scales, sums, group, True)
    assert np.abs(ints).max() <= 127
    np.testing.assert_array_equal(values, ints.astype(np.float32) * np.repeat(int_scales, group))


@numba.njit(cache=True)
def _both_selections(q, ints, scales, int_scales, n_groups, group_shift, host_row, host_rows):
    """(generic one-row, host one-row, generic block, host block) for the 4 rows of ints."""
    out = np.empty((4, 4), np.float32)  # (variant, row)
    for i in range(4):
        out[0, i] = generic_row_int(q, 0, ints[i], scales, 0, int_scales[i], n_groups, group_shift)
        out[1, i] = host_row(q, 0, ints[i], scales, 0, int_scales[i], n_groups, group_shift)
    generic_rows_int(q, 0, ints, 0, scales, 0, int_scales, n_groups, group_shift, out[2])
    host_rows(q, 0, ints, 0, scales, 0, int_scales, n_groups, group_shift, out[3])
    return out


def _extreme_codes(rng, group_shift: int, cols: int = 1024):
    """Every weight code from -128 to 127 (maddubs's |w| = 128 included, and vpdpbusd's) in
    random order, against rows of activation codes 127, -127 and random ones, random scales."""
    q = np.resize(np.arange(-128, 128, dtype=np.int16), cols).astype(np.int8)
    rng.shuffle(q)
    ints = rng.integers(-127, 128, (4, cols)).astype(np.int8)
    ints[0, :] = 127
    ints[1, :] = -127
    n_groups = cols >> group_shift
    scales = rng.standard_normal(n_groups).astype(np.float32)
    int_scales = rng.random((4, n_groups), dtype=np.float32)
    return q, ints, scales, int_scales, n_groups


@pytest.mark.parametrize("simd", SELECTIONS)
@pytest.mark.parametrize("group_shift", [4, 5])
def test_every_selection_and_row_block_gives_the_same_bits(simd, group_shift):
    # The block of four rows equals four single rows, in every selection, and equals generic.
    q, ints, scales, int_scales, n_groups = _extreme_codes(
        np.random.default_rng(group_shift + 10), group_shift
    )
    row, rows, _ = intdot.SELECTED[_runnable(simd)]
    out = _both_selections(q, ints, scales, int_scales, n_groups, group_shift, row, rows)
    for variant in out[1:]:
        np.testing.assert_array_equal(variant, out[0])


@pytest.mark.parametrize("simd", SELECTIONS)
@pytest.mark.parametrize("group_shift", [4, 5])
def test_every_selection_equals_the_bitwise_numpy_reference(simd, group_shift):
    q, ints, scales, int_scales, n_groups = _extreme_codes(
        np.random.default_rng(group_shift + 20), group_shift, 512
    )
    row, rows, _ = intdot.SELECTED[_runnable(simd)]
    out = _both_selections(q, ints, scales, int_scales, n_groups, group_shift, row, rows)
    expected = [dot_row_bitwise_reference(q, ints[i], scales, int_scales[i]) for i in range(4)]
    np.testing.assert_array_equal(out[1], np.array(expected, np.float32))
    np.testing.assert_array_equal(out[3], out[1])


def test_the_bitwise_reference_rounds_once():
    # 1 + 2^-24 lies halfway between two float32s: ties go to even (1.0); a hair above it
    # rounds up, which float64-then-float32 would get wrong (it lands on the tie first).
    from fractions import Fraction

    assert round_to_float32(Fraction(1) + Fraction(1, 2**24)) == np.float32(1.0)
    assert round_to_float32(Fraction(1) + Fraction(1, 2**24) + Fraction(1, 2**60)) == np.nextafter(
        np.float32(1.0), np.float32(2.0)
    )
    assert round_to_float32(Fraction(1) + Fraction(3, 2**24)) == np.float32(1.0) + np.float32(2.0**-22)


@numba.njit(cache=True)
def _nibble_variants(packed, q, ints, scales, int_scales, n_groups, offset, rows, pair, row):
    """[int8 one-row, generic nibble one-row, host nibble one-row, generic nibble block, host
    nibble block, host nibble pair] for the 4 activation rows against weight row 0 of q/packed
    (the pair also takes weight row 1, whose values land in the last variant's second half)."""
    cols, half = q.shape[1], packed.shape[1]
    out = np.zeros((7, 4), np.float32)  # (variant, activation row)
    flat_q, flat_packed, flat_scales = q.ravel(), packed.ravel(), scales.ravel()
    for i in range(4):
        out[0, i] = dot_row_int(flat_q, 0, ints[i], flat_scales, 0, int_scales[i], n_groups, 5)
        g = generic_row_nib(flat_packed, 0, ints[i], flat_scales, 0, int_scales[i], n_groups, offset)
        out[1, i] = g
        out[2, i] = row(flat_packed, 0, ints[i], flat_scales, 0, int_scales[i], n_groups, offset)
    generic_rows_nib(flat_packed, 0, ints, 0, flat_scales, 0, int_scales, n_groups, offset, out[3])
    rows(flat_packed, 0, ints, 0, flat_scales, 0, int_scales, n_groups, offset, out[4])
    pair(flat_packed, 0, half, ints[0], flat_scales, 0, n_groups, int_scales[0], n_groups, offset, out[5])
    out[6, 0] = dot_row_int(flat_q, cols, ints[0], flat_scales, n_groups, int_scales[0], n_groups, 5)
    return out


@pytest.mark.parametrize("simd", SELECTIONS)
@pytest.mark.parametrize("offset", [0, NIBBLE_OFFSET])
def test_packed_nibbles_give_the_int8_codes_bits(simd, offset):
    # Every 4-bit code (0..15, or -8..7 for Q4_0) against extreme and random activation codes:
    # unpacked in registers, the nibbles give the int8 copy's integer lanes, so its bits, in
    # every instruction selection and row shape, and the bitwise numpy reference's.
    host_row, host_rows, host_pair = nibbles.SELECTED[_runnable(simd)]
    rng = np.random.default_rng(offset)
    cols = 1024
    q = (rng.integers(0, 16, (2, cols)) - offset).astype(np.int8)
    q[0, :32] = -offset  # a whole group of the lowest code and one of the highest
    q[0, 32:64] = 15 - offset
    assert packable_offset(q, 32) == offset
    packed = pack_nibbles(q, offset)
    assert packed.shape == (2, cols // 2)
    np.testing.assert_array_equal(unpack_nibbles(packed, offset), q)
    ints = rng.integers(-127, 128, (4, cols)).astype(np.int8)
    ints[0, :], ints[1, :] = 127, -127
    n_groups = cols // 32
    scales = rng.standard_normal((2, n_groups)).astype(np.float32)
    int_scales = rng.random((4, n_groups), dtype=np.float32)
    out = _nibble_variants(
        packed.view(np.int8), q, ints, scales, int_scales, n_groups, offset, host_rows, host_pair, host_row
    )
    for variant in out[1:5]:
        np.testing.assert_array_equal(variant, out[0])
    assert out[5, 0] == out[0, 0] and out[5, 1] == out[6, 0]
    expected = [dot_row_bitwise_reference(q[0], ints[i], scales[0], int_scales[i]) for i in range(4)]
    np.testing.assert_array_equal(out[2], np.array(expected, np.float32))


def test_only_four_bit_groups_of_32_are_packed():
    assert packable_offset(np.arange(-8, 8, dtype=np.int8), 32) == NIBBLE_OFFSET
    assert packable_offset(np.arange(0, 16, dtype=np.int8), 32) == 0
    assert packable_offset(np.arange(0, 16, dtype=np.int8), 16) is None  # groups of 16 stay int8
    assert packable_offset(np.arange(-8, 9, dtype=np.int8), 32) is None  # needs five bits
    assert packable_offset(np.arange(-1, 15, dtype=np.int8), 32) is None
