"""Q5_0 read as the file packs it (quants/quint.py): the blocks round-trip, every selection's
one-row and pair kernels (and the 512-bit pair) give the int8 copy's bits and agree with the
numpy reference, and the fused step of a Q5_0 model reads the blocks where DECODE_BLOCKS."""

from __future__ import annotations

import numpy as np
import pytest

from inference.engine.jit.simd import SELECTIONS, missing_features, target_features
from inference.engine.quants import intdot, quint
from inference.engine.quants.blocks import BLOCK_Q5_0, KINDS
from inference.engine.quants.formats import Q5_0
from inference.engine.quants.quint import (
    QUINT_BLOCK,
    dot_row_quint_reference,
    quint_packable,
    quint_row_bytes,
    wide_dot_pair_quint,
    wide_dot_quad_quint,
)
from inference.engine.quants.wide_ir import fits

COLS = 896


def _runnable(simd: str) -> str:
    missing = missing_features(simd, target_features())
    if missing:
        pytest.skip(f"the CPU lacks {', '.join(missing)} for the {simd} selection")
    return simd


def _matrix(seed: int, rows: int = 6, cols: int = COLS):
    """Q5_0-range codes with the extremes in the first groups, f16 scales, an activation row."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-16, 16, (rows, cols)).astype(np.int8)  # (rows, cols)
    q[0, :32], q[1, :32], q[2, :32] = -16, 15, np.arange(-16, 16)
    scales = rng.standard_normal((rows, cols // 32)).astype(np.float16).astype(np.float32)  # (rows, groups)
    ints = rng.integers(-127, 128, cols).astype(np.int8)  # (cols,)
    ints[:32] = -127
    int_scales = rng.random(cols // 32).astype(np.float32)  # (groups,)
    return q, scales, ints, int_scales


def test_blocks_are_the_files_bytes_and_round_trip():
    q, scales, _, _ = _matrix(0)
    blocks = Q5_0.pack_rows(q, scales)
    assert blocks.shape == (q.shape[0], quint_row_bytes(COLS)) == (q.shape[0], COLS // 32 * QUINT_BLOCK)
    codes, d, mins = Q5_0.unpack_rows(blocks)
    np.testing.assert_array_equal(codes, q)
    np.testing.assert_array_equal(d, scales)
    assert mins is None


def test_only_five_bit_codes_with_f16_scales_in_groups_of_32_are_packable():
    q, scales, _, _ = _matrix(1)
    assert quint_packable(q, scales, 32)
    assert not quint_packable(q, scales, 16)
    wide = q.copy()
    wide[0, 0] = 16
    assert not quint_packable(wide, scales, 32)
    fine = scales.copy()
    fine[0, 0] = np.float32(1.0) + np.float32(2.0**-20)  # not an f16
    assert not quint_packable(q, fine, 32)


def _int8_pair(q, scales, ints, int_scales, r, simd):
    _, _, pair = intdot.SELECTED[simd]
    out = np.zeros(2, np.float32)
    g = COLS // 32
    pair(q.ravel(), r * COLS, (r + 1) * COLS, ints, scales.ravel(), r * g, (r + 1) * g, int_scales, g, 5, out)
    return out


@pytest.mark.parametrize("simd", SELECTIONS)
def test_every_selection_gives_the_int8_copys_bits(simd):
    _runnable(simd)
    q, scales, ints, int_scales = _matrix(2)
    blocks, g = Q5_0.pack_rows(q, scales).ravel().view(np.int8), COLS // 32
    row, pair = quint.SELECTED[simd]
    narrow_pair = quint.NARROW[simd].pair
    rb, flat_s = quint_row_bytes(COLS), scales.ravel()
    for r in range(0, q.shape[0], 2):
        expected = _int8_pair(q, scales, ints, int_scales, r, "generic")
        for kernel in {pair, narrow_pair}:
            out = np.full(2, np.nan, np.float32)
            kernel(blocks, r * rb, (r + 1) * rb, ints, flat_s, 0, 0, int_scales, g, out)
            np.testing.assert_array_equal(out, expected)
        for i in range(2):
            one = row(blocks, (r + i) * rb, ints, flat_s, 0, int_scales, g)
            assert one == expected[i]
            reference = dot_row_quint_reference(
                blocks[(r + i) * rb : (r + i + 1) * rb].view(np.uint8), ints, int_scales
            )
            bound = 2 * g * 2.0**-24 * (np.abs(scales).max() * int_scales.max() * 127 * 16 * COLS)
            assert abs(one - reference) <= bound


def test_the_512_bit_pair_and_quad_give_the_int8_copys_bits():
    if not fits(target_features()):
        pytest.skip("the CPU lacks AVX-512 BW / VNNI for the 512-bit pair")
    for seed in range(3, 6):
        q, scales, ints, int_scales = _matrix(seed, rows=8, cols=32 * (seed + 1))
        cols, g = q.shape[1], q.shape[1] // 32
        blocks, rb = Q5_0.pack_rows(q, scales).ravel().view(np.int8), quint_row_bytes(cols)
        _, _, pair = intdot.SELECTED["generic"]
        for r in range(0, 8, 2):
            expected, out = np.zeros(2, np.float32), np.zeros(2, np.float32)
            pair(
                q.ravel(),
                r * cols,
                (r + 1) * cols,
                ints,
                scales.ravel(),
                r * g,
                (r + 1) * g,
                int_scales,
                g,
                5,
                expected,
            )
            wide_dot_pair_quint(blocks, r * rb, (r + 1) * rb, ints, scales.ravel(), 0, 0, int_scales, g, out)
            np.testing.assert_array_equal(out, expected)
            if r % 4 == 0:  # four rows a call: two pairs sharing the activation's work
                quad = np.zeros(4, np.float32)
                wide_dot_quad_quint(
                    blocks, r * rb, (r + 1) * rb, ints, scales.ravel(), 0, 0, int_scales, g, quad
                )
                following = np.zeros(2, np.float32)
                pair(
                    q.ravel(),
                    (r + 2) * cols,
                    (r + 3) * cols,
                    ints,
                    scales.ravel(),
                    (r + 2) * g,
                    (r + 3) * g,
                    int_scales,
                    g,
                    5,
                    following,
                )
                np.testing.assert_array_equal(quad, np.concatenate([expected, following]))


def test_the_fused_step_reads_q5_0_matrices_as_blocks(synthetic_dir):
    from inference.engine.engine import Engine
    from inference.engine.fused import step_kernels as sk
    from tests.fixtures.synthetic_gguf import synthetic_path

    model = Engine.load(synthetic_path("llama", synthetic_dir)).model
    linears = model.fused.model.linears.reshape(-1, sk.LINEAR_FIELDS)  # (layers * slots, fields)
    used = linears[linears[:, sk.ROWS] > 0]
    with_blocks = used[used[:, sk.QUINT] >= 0]
    kinds = with_blocks[:, sk.QUINT] % KINDS
    # The file's Q5_0 matrices are held as their blocks alone, on every instruction selection.
    own = with_blocks[kinds == BLOCK_Q5_0]
    assert (own[:, sk.Q_OFF] == sk.BLOCKS_ONLY).any() and (own[:, sk.M_OFF] == -1).all()
    # Another format's matrices keep their codes for the tiles (Q4_0's nibbles: no blocks).
    assert ((used[:, sk.Q_OFF] == sk.BLOCKS_ONLY) == (used[:, sk.QUINT] >= 0)).all()
