"""Q4_K and Q6_K read as the file packs them (quants/kblocks.py): every selection's pair kernel
over the file's super-blocks gives the bits of the nibble / int8 kernels the loader's layout
feeds (min terms included), agrees with the numpy reference, and a fused step of a model
with K-quant matrices reads the file's blocks on every CPU, with prefill's bits."""

from __future__ import annotations

import numpy as np
import pytest

from inference.engine.jit.simd import SELECTIONS, missing_features, target_features
from inference.engine.quants import intdot, kblocks, pair_mins, wide_ir
from inference.engine.quants.formats import GGMLType
from inference.engine.quants.kquants import Q4_K, Q6_K
from inference.engine.quants.nibbles import pack_nibbles, packable_offset

COLS = 768  # three super-blocks


def _file_rows(fmt, rows: int, seed: int) -> np.ndarray:
    """Random super-blocks (rows, row bytes) uint8 with finite f16 super-scales: any bytes are
    a valid block once its f16 fields are numbers. Row 0 takes the extremes: f16's largest
    d with the largest sub-scales (Q4_K: 63, codes 15; Q6_K: -128, codes 31)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows * COLS // 256, fmt.type_size()), dtype=np.uint8)  # (blocks, size)
    d_at, f16_fields, scales_at = (0, (0, 2), 4) if fmt is Q4_K else (208, (208,), 192)
    for at in f16_fields:
        values = (rng.standard_normal(len(blocks)) * 0.01).astype("<f2")  # (blocks,)
        blocks[:, at : at + 2] = values.view(np.uint8).reshape(-1, 2)
    first = COLS // 256  # row 0's blocks
    blocks[:first, d_at : d_at + 2] = np.array([65504.0], "<f2").view(np.uint8)
    if fmt is Q4_K:
        blocks[:first, scales_at:] = 0xFF  # 6-bit scales and mins 63, codes 15
    else:
        blocks[:first, :scales_at] = 0xFF  # codes 31
        blocks[:first, scales_at : scales_at + 16] = 0x80  # scales -128
    return blocks.reshape(rows, -1)


def _activation(group: int, seed: int):
    rng = np.random.default_rng(seed)
    ints = rng.integers(-127, 128, COLS).astype(np.int8)  # (cols,)
    ints[:64] = -127
    int_scales = rng.random(COLS // group).astype(np.float32)  # (groups,)
    sums = rng.standard_normal(COLS // group).astype(np.float32) * 40  # (groups,)
    return ints, int_scales, sums


def _selections():
    """Every selection's 256-bit kernels, and the 512-bit pair ("wide")."""
    for simd in SELECTIONS:
        missing = missing_features(simd, target_features())
        yield pytest.param(simd, marks=pytest.mark.skipif(bool(missing), reason=f"the CPU lacks {missing}"))
    fits = wide_ir.fits(target_features())
    yield pytest.param("wide", marks=pytest.mark.skipif(not fits, reason="the CPU lacks AVX-512 BW/VNNI"))


def _kernels(simd: str):
    """(dot_pair_q4k, dot_pair_q6k) of a selection, or the 512-bit pair."""
    if simd == "wide":
        return kblocks.WIDE_PAIRS
    return kblocks.NARROW[simd]


@pytest.mark.parametrize("simd", list(_selections()))
def test_q4_k_blocks_give_the_nibble_kernels_bits(simd):
    rows = 6
    data = _file_rows(Q4_K, rows, 1)
    lay = Q4_K.unpack(data.reshape(-1, Q4_K.type_size()))
    q = lay.q.reshape(rows, COLS)
    scales, mins = lay.scales.reshape(rows, -1), lay.mins.reshape(rows, -1)  # (rows, groups)
    assert packable_offset(q, 32) == 0 and q.max() == 15
    nibbles = pack_nibbles(q, 0).ravel().view(np.int8)
    flat = data.ravel().view(np.int8)
    ints, int_scales, sums = _activation(32, 2)
    g, rb, nb = COLS // 32, kblocks.super_row_bytes(GGMLType.Q4_K, COLS), COLS // 2
    for r in range(0, rows, 2):
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
        _kernels(simd)[0](flat, r * rb, (r + 1) * rb, ints, int_scales, sums, COLS // 256, out)
        np.testing.assert_array_equal(out, expected)
        if simd == "wide" and r + 4 <= rows:  # the quad: this pair and the next
            quad, after = np.full(4, np.nan, np.float32), np.zeros(2, np.float32)
            kblocks.wide_dot_quad_q4k(flat, r * rb, (r + 1) * rb, ints, int_scales, sums, COLS // 256, quad)
            pairs = np.full(4, np.nan, np.float32)  # the quad of selections without it: two pairs
            kblocks.pairs_dot_quad_q4k(flat, r * rb, (r + 1) * rb, ints, int_scales, sums, COLS // 256, pairs)
            np.testing.assert_array_equal(pairs, quad)
            kblocks.WIDE_PAIRS.q4k(
                flat, (r + 2) * rb, (r + 3) * rb, ints, int_scales, sums, COLS // 256, after
            )
            np.testing.assert_array_equal(quad, np.concatenate([expected, after]))
        for i in range(2):
            exact = kblocks.dot_row_reference(GGMLType.Q4_K, data[r + i], ints, int_scales, sums)
            bound = (
                np.abs(scales[r + i] * int_scales).sum() * 32 * 15 * 127 + np.abs(mins[r + i] * sums).sum()
            )
            assert abs(out[i] - exact) <= 1e-5 * bound


@pytest.mark.parametrize("simd", list(_selections()))
def test_q6_k_blocks_give_the_int8_kernels_bits(simd):
    rows = 6
    data = _file_rows(Q6_K, rows, 3)
    lay = Q6_K.unpack(data.reshape(-1, Q6_K.type_size()))
    q = lay.q.reshape(rows, COLS)
    scales = lay.scales.reshape(rows, -1)  # (rows, groups of 16)
    assert q.min() >= -32 and q.max() == 31 and q[0, 0] == 31
    ints, int_scales, sums = _activation(16, 4)
    g, rb = COLS // 16, kblocks.super_row_bytes(GGMLType.Q6_K, COLS)
    flat = data.ravel().view(np.int8)
    for r in range(0, rows, 2):
        expected, out = np.zeros(2, np.float32), np.full(2, np.nan, np.float32)
        intdot.SELECTED["generic"][2](
            q.ravel(),
            r * COLS,
            (r + 1) * COLS,
            ints,
            scales.ravel(),
            r * g,
            (r + 1) * g,
            int_scales,
            g,
            4,
            expected,
        )
        _kernels(simd)[1](flat, r * rb, (r + 1) * rb, ints, int_scales, sums, COLS // 256, out)
        np.testing.assert_array_equal(out, expected)
        if simd == "wide" and r + 4 <= rows:  # the quad: this pair and the next
            quad, after = np.full(4, np.nan, np.float32), np.zeros(2, np.float32)
            kblocks.wide_dot_quad_q6k(flat, r * rb, (r + 1) * rb, ints, int_scales, sums, COLS // 256, quad)
            pairs = np.full(4, np.nan, np.float32)  # the quad of selections without it: two pairs
            kblocks.pairs_dot_quad_q6k(flat, r * rb, (r + 1) * rb, ints, int_scales, sums, COLS // 256, pairs)
            np.testing.assert_array_equal(pairs, quad)
            kblocks.WIDE_PAIRS.q6k(
                flat, (r + 2) * rb, (r + 3) * rb, ints, int_scales, sums, COLS // 256, after
            )
            np.testing.assert_array_equal(quad, np.concatenate([expected, after]))
        for i in range(2):
            exact = kblocks.dot_row_reference(GGMLType.Q6_K, data[r + i], ints, int_scales, sums)
            bound = np.abs(scales[r + i] * int_scales).sum() * 16 * 32 * 127
            assert abs(out[i] - exact) <= 1e-5 * bound


@pytest.mark.parametrize("simd", list(_selections()))
@pytest.mark.parametrize("fmt", [Q4_K, Q6_K], ids=["q4_k", "q6_k"])
def test_the_kernels_that_prefetch_as_they_go_give_the_same_bits(fmt, simd):
    """The ``_ahead`` pairs and quads (decode's stream: a stretch prefetched inside the loop)
    give their plain kernels' bits, wherever the stretch lies in ``q`` (its start, its end,
    the rows themselves)."""
    rows = 8
    data = _file_rows(fmt, rows, 11)
    group = 32 if fmt is Q4_K else 16
    ints, int_scales, sums = _activation(group, 12)
    if fmt is Q6_K:  # Q8_K: one code scale a super-block
        int_scales = np.repeat(int_scales[:: 256 // group], 256 // group)
    qtype = GGMLType.Q4_K if fmt is Q4_K else GGMLType.Q6_K
    rb, n_super, flat = kblocks.super_row_bytes(qtype, COLS), COLS // 256, data.ravel().view(np.int8)
    pairs = _kernels(simd)
    plain, ahead = (pairs.q4k, pairs.q4k_ahead) if fmt is Q4_K else (pairs.q6k, pairs.q6k_ahead)
    lines = kblocks.STRETCH_LINES_Q4K if fmt is Q4_K else kblocks.STRETCH_LINES_Q6K
    last = flat.size - n_super * 64 * lines  # the furthest a stretch may start
    for r in range(0, rows, 2):
        want = np.full(2, np.nan, np.float32)
        plain(flat, r * rb, (r + 1) * rb, ints, int_scales, sums, n_super, want)
        for at in (0, r * rb, last):
            got = np.full(2, np.nan, np.float32)
            ahead(flat, r * rb, (r + 1) * rb, ints, int_scales, sums, n_super, got, at)
            np.testing.assert_array_equal(got, want)
    quads = (
        [(kblocks.pairs_dot_quad_q4k, kblocks.pairs_dot_quad_q4k_ahead)]
        if fmt is Q4_K
        else [(kblocks.pairs_dot_quad_q6k, kblocks.pairs_dot_quad_q6k_ahead)]
    )
    if simd == "wide":
        wide = (kblocks.wide_dot_quad_q4k, kblocks.wide_dot_quad_q4k_ahead)
        quads.append(wide if fmt is Q4_K else (kblocks.wide_dot_quad_q6k, kblocks.wide_dot_quad_q6k_ahead))
    elif simd != kblocks.HOST_SIMD:
        return  # the pairs' quads run the host's selection: checked under its own parameter
    for quad, quad_ahead in quads:
        for r in (0, rows - 4):
            want, got = np.full(4, np.nan, np.float32), np.full(4, np.nan, np.float32)
            quad(flat, r * rb, (r + 1) * rb, ints, int_scales, sums, n_super, want)
            quad_ahead(
                flat, r * rb, (r + 1) * rb, ints, int_scales, sums, n_super, got, min(last, (r + 4) * rb)
            )
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_k_quant_step_reads_the_files_blocks_and_decodes_as_prefill_does(family, synthetic_dir):
    """llama: Q6_K down, Q4_K gate|up stacked (two file parts); qwen2: Q6_K and Q4_K down,
    a Q4_K head. Decode (one row: the blocks) gives prefill's (the tiles: codes) logits."""
    from inference.engine.engine import Engine
    from inference.engine.fused import step_kernels as sk
    from inference.engine.quants import blocks
    from tests.fixtures.synthetic_gguf import synthetic_path

    engine = Engine.load(synthetic_path(family, synthetic_dir))
    model = engine.model.fused.model
    tables = np.concatenate([model.linears.reshape(-1, sk.LINEAR_FIELDS), model.head])  # (slots, fields)
    used = tables[tables[:, sk.ROWS] > 0]
    fields = used[used[:, sk.QUINT] >= 0, sk.QUINT]
    kinds = set(int(f) % blocks.KINDS for f in fields)
    # K-quant matrices are held once, as the file's blocks, whatever the CPU (DECODE_BLOCKS
    # only decides whether repacked formats get a blocks copy too).
    assert {blocks.BLOCK_Q4_K, blocks.BLOCK_Q6_K} <= kinds
    field = int(model.linears[0, 6, sk.QUINT])  # slots q, k, v, out, gate, up, down
    data = np.asarray(engine.model.file.tensor("blk.0.ffn_down.weight").data)  # (rows, row bytes)
    at = blocks.block_offset.py_func(field)
    assert blocks.block_kind.py_func(field) == blocks.BLOCK_Q6_K
    np.testing.assert_array_equal(model.weights.q[at : at + data.size].view(np.uint8), data.ravel())
    tokens = [3, 9, 4, 1, 7, 2]
    prefilled = engine.new_cache(32)
    expected = engine.model.forward(tokens, prefilled, all_logits=True)
    decoded = engine.new_cache(32)
    for i, token in enumerate(tokens):
        np.testing.assert_array_equal(engine.decode_one(decoded, token), expected[i])
