"""The fused forward's product of several token rows (fused/prefill_tiles.py) against its
one-row path (step_kernels' decode kernels), bit for bit: whole tiles and the rows past them,
a sub-range of weight rows, padding rows, min terms, biases, accumulating or not."""

from __future__ import annotations

import numpy as np
import pytest

from inference.engine.fused import prefill_tiles
from inference.engine.fused import step_kernels as sk
from inference.engine.fused import step_products as sp
from inference.engine.fused.step_items import TILE_ROWS
from inference.engine.quants.blocks import BLOCK_Q5_0, encode
from inference.engine.quants.formats import Q5_0
from inference.engine.quants.intdot import ROW_BLOCK
from inference.engine.quants.nibbles import NIBBLE_OFFSET, pack_nibbles

QUINT = -2  # in FORMATS' nib column: int8 codes plus their Q5_0 blocks (quants/quint.py)
# (group shift, nib, lowest code, highest code + 1, with mins)
FORMATS = [
    (5, -1, -16, 16, False),
    (5, QUINT, -16, 16, False),
    (4, -1, -32, 32, False),
    (5, 0, 0, 16, True),
    (5, NIBBLE_OFFSET, -8, 8, False),
]


def _linear(rng, group_shift, nib, low, high, with_mins, rows=29, cols=256):
    """Weights of one linear in arenas of its own, and its table row."""
    q8 = rng.integers(low, high, (rows, cols)).astype(np.int8)  # (rows, cols)
    q = q8.ravel() if nib < 0 else pack_nibbles(q8, nib).view(np.int8).ravel()
    groups = cols >> group_shift
    scales = rng.standard_normal(rows * groups).astype(np.float16).astype(np.float32)  # (rows * groups,)
    quint_at = -1
    if nib == QUINT:  # the one-row path reads the blocks, the tiles the int8 codes
        blocks = Q5_0.pack_rows(q8, scales.reshape(rows, groups)).view(np.int8).ravel()
        q, quint_at, nib = np.concatenate([q, blocks]), encode(q.size, BLOCK_Q5_0), -1
    mins = rng.standard_normal(rows * groups).astype(np.float32)  # (rows * groups,)
    bias = rng.standard_normal(rows).astype(np.float32)  # (rows,)
    none = np.zeros(1, np.float32)
    weights = sk.StepWeights(q, scales, mins if with_mins else none, bias, none, none)
    lin = np.array([0, rows, cols, 0, 0 if with_mins else -1, group_shift, 0, 0, nib, quint_at], np.int64)
    return weights, lin


def _rounded(rng, n, cols, group_shift):
    """Rounded inputs of n token rows (random codes, scales and group sums), zero padding."""
    padded, groups = -(-n // ROW_BLOCK) * ROW_BLOCK, cols >> group_shift
    ints = np.zeros((1, padded, cols), np.int8)  # (slots, rows, cols)
    ints[0, :n] = rng.integers(-127, 128, (n, cols))
    ints[0, 0] = 127
    int_scales = np.zeros((1, padded, groups), np.float32)  # (slots, rows, groups)
    int_scales[0, :n] = rng.random((n, groups))
    sums = np.zeros((1, padded, groups), np.float32)
    sums[0, :n] = rng.standard_normal((n, groups))
    return sk.Rounded(np.zeros((1, padded, cols), np.float32), ints, int_scales, sums)


def _one_row(rounded, t):
    """Token row t alone, as a decode step rounds it."""
    return sk.Rounded(*(np.ascontiguousarray(a[:, t : t + 1]) for a in rounded))


@pytest.mark.parametrize(("group_shift", "nib", "low", "high", "with_mins"), FORMATS)
@pytest.mark.parametrize("accumulate", [False, True])
# n: one block of rows (the narrow tiles); one pass of the tiles over two blocks of rows; three
# passes, the last partial
@pytest.mark.parametrize("n", [3, 7, 37])
def test_several_rows_equal_each_row_alone(group_shift, nib, low, high, with_mins, accumulate, n):
    rng = np.random.default_rng(group_shift * 3 + nib + 7)
    weights, lin = _linear(rng, group_shift, nib, low, high, with_mins)
    cols = int(lin[sk.COLS])
    rounded = _rounded(rng, n, cols, group_shift)
    scratch = np.empty((1 + TILE_ROWS, ROW_BLOCK), np.float32)
    for r0, r1 in [(0, 29), (3, 20)]:  # 3 whole tiles and 5 rows; a tile starting off 0 and 1 row
        start = rng.standard_normal((n, r1 - r0)).astype(np.float32)  # (n, r1 - r0)
        many = start.copy()
        tiles = prefill_tiles.dot_tile_narrow if n <= ROW_BLOCK else prefill_tiles.dot_tile_many
        tiles(weights, lin, rounded, 0, n, r0, r1, many, accumulate, scratch)
        for t in range(n):
            alone = start[t : t + 1].copy()  # (1, r1 - r0)
            one = _one_row(rounded, t)  # as a decode step takes it
            block, mins, at = scratch[0], scratch[1], sk.COLUMN0
            sp.dot_one_row(
                weights, lin, one, 0, sp.ROW0, r0, r1, alone, accumulate, block, mins, at, sk.UPWARD
            )
            np.testing.assert_array_equal(many[t], alone[0])
        if not accumulate:
            assert not np.array_equal(many, start)
