"""Q4_1 read as the file packs it (quants/q41.py): the blocks are the file's bytes and round-trip,
every selection's pair kernel gives the nibble kernel's bits (min terms included), and a
fused step of a Q4_1 model holds only the blocks, and prefill has decode's bits."""

from __future__ import annotations

import numpy as np
import pytest

from inference.engine.jit.simd import missing_features, target_features
from inference.engine.quants import blocks, intdot, pair_mins, q41
from inference.engine.quants.blocks import BLOCK_Q4_1, KINDS
from inference.engine.quants.formats import Q4_1, Q8_0
from inference.engine.quants.nibbles import pack_nibbles
from inference.engine.quants.q41 import Q41_BLOCK, q41_packable, q41_row_bytes
from inference.engine.quants.wide_ir import fits

COLS = 576


def _matrix(seed: int, rows: int = 6, cols: int = COLS):
    """Q4_1 codes with the extremes in the first groups, f16 scales and mins, an activation row."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 16, (rows, cols)).astype(np.int8)  # (rows, cols)
    q[0, :32], q[1, :32], q[2, :32] = 0, 15, np.arange(32) % 16
    scales = rng.standard_normal((rows, cols // 32)).astype(np.float16).astype(np.float32)  # (rows, groups)
    mins = rng.standard_normal((rows, cols // 32)).astype(np.float16).astype(np.float32)  # (rows, groups)
    ints = rng.integers(-127, 128, cols).astype(np.int8)  # (cols,)
    ints[:32] = -127
    int_scales = rng.random(cols // 32).astype(np.float32)  # (groups,)
    sums = rng.standard_normal(cols // 32).astype(np.float32) * 40  # (groups,)
    return q, scales, mins, ints, int_scales, sums


def test_blocks_are_the_files_bytes_and_round_trip():
    q, scales, mins, *_ = _matrix(0)
    blocks = Q4_1.pack_rows(q, scales, mins)
    assert blocks.shape == (q.shape[0], q41_row_bytes(COLS)) == (q.shape[0], COLS // 32 * Q41_BLOCK)
    codes, d, m = Q4_1.unpack_rows(blocks)
    np.testing.assert_array_equal(codes, q)
    np.testing.assert_array_equal(d, scales)
    np.testing.assert_array_equal(m, mins)


def test_only_four_bit_codes_with_f16_scales_and_mins_in_groups_of_32_are_packable():
    q, scales, mins, *_ = _matrix(1)
    assert q41_packable(q, scales, mins, 32)
    assert not q41_packable(q, scales, mins, 16)
    assert not q41_packable(q, scales, None, 32)
    wide = q.copy()
    wide[0, 0] = 16
    assert not q41_packable(wide, scales, mins, 32)
    for which in range(2):  # a scale, then a min, that no f16 holds
        fine = [scales.copy(), mins.copy()]
        fine[which][0, 0] = np.float32(1.0) + np.float32(2.0**-20)
        assert not q41_packable(q, fine[0], fine[1], 32)


def _runnable(simd: str) -> None:
    """Skip unless the CPU runs ``simd``: a selection, or "wide" (512-bit pairs, wide_ir.fits)."""
    if simd == "wide":
        if not fits(target_features()):
            pytest.skip("the CPU lacks AVX-512 BW, VNNI or GFNI for the 512-bit pair")
        return
    missing = missing_features(simd.removesuffix("_256"), target_features())
    if missing:
        pytest.skip(f"the CPU lacks {', '.join(missing)} for the {simd} selection")


# Each selection's kernel, and both of the vnni selection's: 256-bit (AVX-VNNI) and 512-bit.
Q41_KERNELS = {**q41.SELECTED, "vnni_256": q41.NARROW["vnni"], "wide": q41.wide_dot_pair_q41}
Q80_KERNELS = {**blocks.SELECTED, "vnni_256": blocks.NARROW["vnni"], "wide": blocks.wide_dot_pair_q80}


@pytest.mark.parametrize("simd", list(Q41_KERNELS))
def test_every_selection_gives_the_nibble_kernels_bits(simd):
    _runnable(simd)
    q, scales, mins, ints, int_scales, sums = _matrix(2)
    g, rb, nb = COLS // 32, q41_row_bytes(COLS), COLS // 2
    packed = Q4_1.pack_rows(q, scales, mins).ravel().view(np.int8)
    nibbles = pack_nibbles(q, 0).ravel().view(np.int8)
    for r in range(0, q.shape[0], 2):
        expected, out = np.zeros(2, np.float32), np.full(2, np.nan, np.float32)
        pair_mins.SELECTED["generic"](
            nibbles,
            r * nb,
            (r + 1) * nb,
            ints,
            scales.ravel(),
            r * g,
            (r + 1) * g,
            int_scales,
            mins.ravel(),
            r * g,
            (r + 1) * g,
            sums,
            g,
            5,
            0,
            expected,
        )
        Q41_KERNELS[simd](
            packed, r * rb, (r + 1) * rb, ints, scales.ravel(), int_scales, mins.ravel(), sums, g, out
        )
        np.testing.assert_array_equal(out, expected)
        # Against float64 numpy: each row's sum of d * code * a + m * group sum.
        for i in range(2):
            lanes = (q[r + i].astype(np.int64) * ints).reshape(g, 32).sum(axis=1)  # (groups,)
            exact = (scales[r + i] * int_scales * lanes + mins[r + i] * sums).astype(np.float64).sum()
            assert abs(out[i] - exact) <= 1e-4 * (np.abs(scales[r + i] * int_scales * lanes).sum() + 1)


def test_a_q4_1_step_reads_the_blocks_and_decodes_as_prefill_does(synthetic_dir):
    from inference.engine.engine import Engine
    from inference.engine.fused import step_kernels as sk
    from tests.fixtures.synthetic_gguf import synthetic_path

    engine = Engine.load(synthetic_path("llama", synthetic_dir))
    linears = engine.model.fused.model.linears.reshape(-1, sk.LINEAR_FIELDS)  # (layers * slots, fields)
    used = linears[linears[:, sk.ROWS] > 0]
    q4_1 = used[(used[:, sk.QUINT] >= 0) & (used[:, sk.QUINT] % KINDS == BLOCK_Q4_1)]
    assert len(q4_1) > 0 and (q4_1[:, sk.Q_OFF] == sk.BLOCKS_ONLY).all()  # the blocks, nothing else
    assert (q4_1[:, sk.M_OFF] >= 0).all()  # (the format has mins: the inputs' group sums are made)
    tokens = [3, 9, 4, 1, 7, 2]
    prefilled = engine.new_cache(32)
    expected = engine.model.forward(tokens, prefilled, all_logits=True)  # tiles: unpacked blocks
    decoded = engine.new_cache(32)
    for i, token in enumerate(tokens):
        np.testing.assert_array_equal(engine.decode_one(decoded, token), expected[i])  # the blocks


def _q80_matrix(rows: int = 6, cols: int = COLS):
    """Q8_0 codes with the extremes in the first groups, f16 scales, an activation row."""
    rng = np.random.default_rng(7)
    q = rng.integers(-128, 128, (rows, cols)).astype(np.int8)  # (rows, cols)
    q[0, :32], q[1, :32] = -128, 127
    scales = rng.standard_normal((rows, cols // 32)).astype(np.float16).astype(np.float32)  # (rows, groups)
    ints = rng.integers(-127, 128, cols).astype(np.int8)  # (cols,)
    ints[:32] = -127
    int_scales = rng.random(cols // 32).astype(np.float32)  # (groups,)
    return q, scales, ints, int_scales


def test_q8_0_blocks_are_the_files_bytes_and_round_trip():
    q, scales, _, _ = _q80_matrix()
    rows, cols = q.shape
    packed = Q8_0.pack_rows(q, scales)
    rb = blocks.block_row_bytes(blocks.BLOCK_Q8_0, cols)
    assert packed.shape == (rows, rb) and blocks.q80_packable(q, scales, 32)
    codes, d, _ = Q8_0.unpack_rows(packed)
    np.testing.assert_array_equal(codes, q)
    np.testing.assert_array_equal(d, scales)
    fine = scales.copy()
    fine[0, 0] = np.float32(1.0) + np.float32(2.0**-20)  # not an f16
    assert not blocks.q80_packable(q, fine, 32)


@pytest.mark.parametrize("simd", list(Q80_KERNELS))
def test_every_q8_0_block_kernel_gives_the_int8_copys_bits(simd):
    _runnable(simd)
    q, scales, ints, int_scales = _q80_matrix()
    rows, cols, g = *q.shape, q.shape[1] // 32
    rb = blocks.block_row_bytes(blocks.BLOCK_Q8_0, cols)
    flat = Q8_0.pack_rows(q, scales).ravel().view(np.int8)
    for r in range(0, rows, 2):
        expected, out = np.zeros(2, np.float32), np.full(2, np.nan, np.float32)
        intdot.SELECTED["generic"][2](
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
        Q80_KERNELS[simd](flat, r * rb, (r + 1) * rb, ints, scales.ravel(), int_scales, g, out)
        np.testing.assert_array_equal(out, expected)
