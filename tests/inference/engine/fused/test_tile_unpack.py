"""The numba unpacking of a tile of file blocks (fused/tile_unpack.py) gives, bit for bit, the
codes, scales and mins of the numpy repack (quants/layout.py) it stands in for."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from inference.engine.fused.fused import NATIVE_KINDS
from inference.engine.fused.tile_unpack import group_size, has_mins, unpack_rows
from inference.engine.quants.formats import FORMATS
from inference.engine.quants.layout import repack
from inference.engine.quants.matrix import BLOCK_NATIVE_TYPES
from tests.inference.engine.test_quants import random_quant_bytes

ROWS, COLS = 7, 512


def test_every_native_format_has_a_block_kind():
    assert set(NATIVE_KINDS) == BLOCK_NATIVE_TYPES


@pytest.mark.parametrize("qtype", sorted(BLOCK_NATIVE_TYPES, key=lambda t: t.name))
def test_unpacked_rows_are_the_repacked_layouts(qtype: Q):
    data = random_quant_bytes(qtype, ROWS, COLS, seed=int(qtype))  # (rows, row bytes)
    reference = repack(FORMATS[qtype], data, COLS)
    kind = NATIVE_KINDS[qtype]
    assert group_size(kind) == FORMATS[qtype].group_size
    assert has_mins(kind) == FORMATS[qtype].has_mins
    groups = COLS // group_size(kind)
    # Rows 2..6 from an arena where the blocks start at an odd byte, as they may in the q arena.
    arena = np.concatenate([np.zeros(3, np.uint8), data.ravel()]).view(np.int8)
    first, n = 2, ROWS - 2
    codes = np.zeros(n * COLS, np.int8)
    scales = np.zeros(n * groups, np.float32)
    mins = np.zeros(n * groups, np.float32)
    unpack_rows(arena, 3 + first * data.shape[1], kind, COLS, n, codes, scales, mins)
    np.testing.assert_array_equal(codes.reshape(n, COLS), reference.q[first:])
    np.testing.assert_array_equal(scales.view(np.uint32), reference.scales[first:].ravel().view(np.uint32))
    if reference.mins is not None:  # (negative zeros included: bits, not values)
        np.testing.assert_array_equal(mins.view(np.uint32), reference.mins[first:].ravel().view(np.uint32))
