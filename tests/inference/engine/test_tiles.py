"""The register-tiled multi-row product (quants/tiles.py): bit for bit the one-row kernel's
values and the numpy reference's, in every instruction selection the CPU can run, for every
code packing the fused forward uses (int8 in groups of 16 and 32, nibbles with offset 0 and 8,
and the file's Q5_0, Q8_0 and Q4_1 blocks)."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from inference.engine.jit.simd import SELECTIONS, missing_features, target_features
from inference.engine.quants import tiles
from inference.engine.quants.codes import Q4_1_TAG, Q5_0_TAG, Q8_0_TAG
from inference.engine.quants.formats import Q4_1, Q5_0, Q8_0
from inference.engine.quants.intdot import ROW_BLOCK, dot_row_int
from inference.engine.quants.nibbles import NIBBLE_OFFSET, pack_nibbles
from inference.engine.quants.tiles import NARROW_W, TILE_W, WIDE_FEATURES, dot_tile_reference

CASES = [
    (4, -1, -128, 128),
    (5, -1, -128, 128),
    (5, -1, -16, 16),
    (5, 0, 0, 16),
    (5, NIBBLE_OFFSET, -8, 8),
    (5, Q5_0_TAG, -16, 16),
    (5, Q8_0_TAG, -128, 128),
    (5, Q4_1_TAG, 0, 16),
]
# The file's blocks, scales inside (Q4_1's mins too: the tile leaves them to its caller).
BLOCKS = {
    Q5_0_TAG: Q5_0.pack_rows,
    Q8_0_TAG: Q8_0.pack_rows,
    Q4_1_TAG: lambda q, scales: Q4_1.pack_rows(q, scales, -scales),
}


def _runnable(simd: str) -> str:
    if simd == "wide":
        missing = tuple(f for f in WIDE_FEATURES if f not in target_features())
    else:
        missing = missing_features(simd, target_features())
    if missing:
        pytest.skip(f"the CPU lacks {', '.join(missing)} for the {simd} tile")
    return simd


@numba.njit(cache=True)
def _tile_and_rows(
    kernel, width, q_flat, row_bytes, ints, scales, int_scales, n_groups, group_shift, nib, q8, n_tiles
):
    """(tile kernel values, one-row kernel values) for ``width`` * n_tiles weight rows x the
    activation rows, each (weight rows, activation rows), and the tiles' output buffer."""
    width = numba.literally(width)  # a tile's width is a constant of its code
    n_w, n_act = width * n_tiles, ints.shape[0]
    tiled = np.empty((n_w, n_act), np.float32)  # (w, n)
    single = np.empty((n_w, n_act), np.float32)  # (w, n)
    out = np.full((ROW_BLOCK, n_w + 3), np.nan, np.float32)  # (activation rows, weight rows + margin)
    s_flat, q8_flat, cols = scales.ravel(), q8.ravel(), q8.shape[1]
    for tile in range(n_tiles):
        w0 = tile * width
        for n0 in range(0, n_act, ROW_BLOCK):
            kernel(
                width,
                q_flat,
                w0 * row_bytes,
                row_bytes,
                ints,
                n0,
                s_flat,
                w0 * n_groups,
                n_groups,
                int_scales,
                group_shift,
                nib,
                out,
                w0 + 1,  # a column offset: the tile lands at columns w0 + 1 .. w0 + width
            )
            for w in range(width):
                for i in range(ROW_BLOCK):
                    tiled[w0 + w, n0 + i] = out[i, w0 + 1 + w]
    for w in range(n_w):
        for n in range(n_act):
            single[w, n] = dot_row_int(
                q8_flat, w * cols, ints[n], s_flat, w * n_groups, int_scales[n], n_groups, group_shift
            )  # noqa: E501
    return tiled, single, out


def _problem(rng, group_shift, nib, low, high, n_w, cols=512, n_act=8):
    """Codes in [low, high) with the extremes present, activation rows with +-127 rows."""
    q8 = rng.integers(low, high, (n_w, cols)).astype(np.int8)  # (w, cols)
    q8[0, : 1 << group_shift] = low
    q8[1, : 1 << group_shift] = high - 1
    ints = rng.integers(-127, 128, (n_act, cols)).astype(np.int8)  # (n, cols)
    ints[0], ints[1] = 127, -127
    n_groups = cols >> group_shift
    scales = rng.standard_normal((n_w, n_groups)).astype(np.float32)  # (w, groups)
    int_scales = rng.random((n_act, n_groups), dtype=np.float32)  # (n, groups)
    if nib in BLOCKS:  # an f16 scale in each block
        scales = scales.astype(np.float16).astype(np.float32)
        blocks = BLOCKS[nib](q8, scales).view(np.int8)  # (w, row bytes)
        return q8, blocks.ravel(), blocks.shape[1], ints, scales, int_scales, n_groups
    if nib < 0:
        return q8, q8.ravel(), cols, ints, scales, int_scales, n_groups
    packed = pack_nibbles(q8, nib).view(np.int8)  # (w, cols // 2)
    return q8, packed.ravel(), cols // 2, ints, scales, int_scales, n_groups


@pytest.mark.parametrize("width", [TILE_W, NARROW_W])
@pytest.mark.parametrize("simd", ["wide", *SELECTIONS])
@pytest.mark.parametrize(("group_shift", "nib", "low", "high"), CASES)
def test_tiles_give_the_one_row_kernels_bits(simd, group_shift, nib, low, high, width):
    kernel = tiles.SELECTED[_runnable(simd)]
    rng = np.random.default_rng(group_shift * 7 + nib + 100)
    q8, q_flat, row_bytes, ints, scales, int_scales, n_groups = _problem(
        rng, group_shift, nib, low, high, 2 * width
    )
    tiled, single, out = _tile_and_rows(
        kernel, width, q_flat, row_bytes, ints, scales, int_scales, n_groups, group_shift, nib, q8, 2
    )
    np.testing.assert_array_equal(tiled, single)
    assert np.isnan(out[:, 0]).all()  # nothing lands left of the column offset


@pytest.mark.parametrize("width", [TILE_W, NARROW_W])
@pytest.mark.parametrize(("group_shift", "nib", "low", "high"), CASES[:2] + CASES[3:4])
def test_host_tile_equals_the_bitwise_numpy_reference(group_shift, nib, low, high, width):
    rng = np.random.default_rng(group_shift + 300)
    q8, q_flat, row_bytes, ints, scales, int_scales, n_groups = _problem(
        rng, group_shift, nib, low, high, width, 256, 4
    )
    tiled, _, _ = _tile_and_rows(
        tiles.dot_tile_rows,
        width,
        q_flat,
        row_bytes,
        ints,
        scales,
        int_scales,
        n_groups,
        group_shift,
        nib,
        q8,
        1,
    )
    np.testing.assert_array_equal(tiled, dot_tile_reference(q8, scales, ints, int_scales))
