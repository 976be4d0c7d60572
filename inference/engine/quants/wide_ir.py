"""LLVM IR of a decode pair over file blocks with both weight rows in one 512-bit register.

intdot_ir.row_dots handles a pair as two 256-bit streams: per group and row an unpack, a scale
widening and multiply, vpdpbusd, a convert and an FMA, ~16 instructions a row; one thread then
runs ALU-bound (~36 Gweights/s for Q4_1 from L2), about what two threads may stream. Here row
A's group fills the low 256 bits and row B's the high 256, so each step runs once for both rows:

    codes  = Q5_0: nibbles of [A.qs, A.qs, B.qs, B.qs] (low, high, low, high: vgf2p8affineqb),
                   + 16 where the bit of [A.qh, B.qh] is set (a merge-masked vpaddb)
             Q4_1: the same nibbles (codes 0..15, no offset)
             Q8_0: [A.qs, B.qs] + 128 (one vpxord: unsigned, as vpdpbusd wants them)
    lanes  = vpdpbusd(-offset * quad sums of a, codes, [a, a])   (offset 16, 0 or 128)
    acc    = fma(float(lanes), [fl(dA * d_a) x 8, fl(dB * d_a) x 8], acc)
    Q4_1:  chain = fma([mA, mB], group sum of a, chain)        (the min terms, two lanes)

Lanes 0-7 are row A's lanes of intdot_ir (lane j: codes 4j..4j+3), lanes 8-15 row B's: the
integer lanes are exact whatever sequence makes them, and every float lane sees the same
operations in the same order, so each row's sum (lane_sum of its half, plus its min chain)
has the bits of the int8 copy's. Needs AVX-512 BW, VNNI and GFNI (``fits``). One thread from
L2 (bench/lab/q5_stream.py --rows 1024 --passes 400 --threads 1): Q5_0 44 Gweights/s against 27
for two 256-bit streams; the fifth bits built in a general register (kmovq) or the scales
inserted as scalars (vpinsrw) cost ~1.5x each.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from .codes import Q4_1_BLOCKS, Q5_0_BLOCKS, Q8_0_BLOCKS
from .intdot_ir import EXACT, I8, I32, _call, lane_sum

WIDE = 16  # int32 / float lanes of one 512-bit register
I64 = ir.IntType(64)
NEEDED_FEATURES = ("avx512bw", "avx512vnni", "avx512vl", "gfni")
# vgf2p8affineqb matrices (bit i of a result byte = parity of the matrix's byte 7 - i and
# the source byte): the low nibble, and the high nibble moved down.
_LOW_NIBBLE, _HIGH_NIBBLE = 0x0102040800000000, 0x1020408000000000
Q5_0, Q4_1, Q8_0 = "q5_0", "q4_1", "q8_0"
LAYOUT = {Q5_0: Q5_0_BLOCKS, Q4_1: Q4_1_BLOCKS, Q8_0: Q8_0_BLOCKS}  # codes.py
# What the unsigned codes vpdpbusd reads are stored plus: Q8_0's int8 codes are moved up by 128.
CODE_OFFSET = {Q5_0: Q5_0_BLOCKS.offset, Q4_1: Q4_1_BLOCKS.offset, Q8_0: 128}


def fits(features: frozenset[str]) -> bool:
    """Whether the CPU runs these kernels (512-bit byte ops and vpdpbusd)."""
    return all(f in features for f in NEEDED_FEATURES)


def _byte_pointer(builder, block, offset: int, vector_type):
    return builder.bitcast(builder.gep(block, [ir.Constant(I64, offset)]), vector_type.as_pointer())


def _order(values: list[int]) -> ir.Constant:
    return ir.Constant(ir.VectorType(I32, len(values)), values)


def _pair_nibbles(builder, block_a, block_b, qs_at: int):
    """<64 x i8>: row A's 32 codes then row B's, from 16 bytes of nibbles each at ``qs_at``."""
    qs_type = ir.VectorType(I8, 16)
    qs_a = builder.load(_byte_pointer(builder, block_a, qs_at, qs_type), align=1)
    qs_b = builder.load(_byte_pointer(builder, block_b, qs_at, qs_type), align=1)
    both = builder.shuffle_vector(qs_a, qs_b, _order(list(range(16)) * 2 + list(range(16, 32)) * 2))
    # One GF(2) affine map per byte picks its low nibble (128-bit lanes 0, 2) or its high one
    # (lanes 1, 3: codes 16..31), in place of a variable shift and an and.
    matrices = ir.Constant(ir.VectorType(I64, 8), ([_LOW_NIBBLE] * 2 + [_HIGH_NIBBLE] * 2) * 2)
    return _call(
        builder,
        "llvm.x86.vgf2p8affineqb.512",
        both.type,
        [both, builder.bitcast(matrices, both.type), ir.Constant(I8, 0)],
    )


def _quint_codes(builder, block_a, block_b):
    """Q5_0: <64 x i8> row A's codes then row B's, stored plus 16 (0..31)."""
    nibbles = _pair_nibbles(builder, block_a, block_b, Q5_0_BLOCKS.codes_at)
    mask_type = ir.VectorType(ir.IntType(1), 32)
    # Two mask loads joined (kunpckdq): built in a general register (shift, or, kmovq) the
    # mask cost ~1.5x the kernel's time, the moves from general registers being scarce.
    bits_a = builder.load(_byte_pointer(builder, block_a, Q5_0_BLOCKS.fifth_bits_at, mask_type), align=1)
    bits_b = builder.load(_byte_pointer(builder, block_b, Q5_0_BLOCKS.fifth_bits_at, mask_type), align=1)
    bits = builder.shuffle_vector(bits_a, bits_b, _order(list(range(64))))
    # + 16 where the bit is set, as select(bits, nibbles + 16, nibbles): one merge-masked
    # vpaddb (an or, then a masked move, was one instruction more)
    return builder.select(bits, builder.add(nibbles, ir.Constant(nibbles.type, [16] * 64)), nibbles)


def _q80_codes(builder, block_a, block_b):
    """Q8_0: <64 x i8> row A's int8 codes then row B's, plus 128 (unsigned)."""
    qs_type = ir.VectorType(I8, 32)
    qs_a = builder.load(_byte_pointer(builder, block_a, Q8_0_BLOCKS.codes_at, qs_type), align=1)
    qs_b = builder.load(_byte_pointer(builder, block_b, Q8_0_BLOCKS.codes_at, qs_type), align=1)
    both = builder.shuffle_vector(qs_a, qs_b, _order(list(range(64))))
    return builder.xor(both, ir.Constant(both.type, [-128] * 64))


def _pair_codes(builder, kind: str, block_a, block_b):
    if kind == Q5_0:
        return _quint_codes(builder, block_a, block_b)
    if kind == Q4_1:
        return _pair_nibbles(builder, block_a, block_b, Q4_1_BLOCKS.codes_at)
    return _q80_codes(builder, block_a, block_b)


def _pair_heads(builder, block_a, block_b, element: int):
    """<2 x float>: the f16 at half ``element`` of each block (d: 0, Q4_1's m: 1), widened
    (exact). Vector loads of the blocks' first 16 bytes and one word shuffle: two scalar halves
    inserted (vpinsrw) cost as much again as the mask built in a general register."""
    eight = ir.VectorType(ir.HalfType(), 8)
    head_a = builder.load(builder.bitcast(block_a, eight.as_pointer()), align=1)
    head_b = builder.load(builder.bitcast(block_b, eight.as_pointer()), align=1)
    pair = builder.shuffle_vector(head_a, head_b, _order([element, 8 + element]))
    return builder.fpext(pair, ir.VectorType(ir.FloatType(), 2))


def _splat2(builder, value):
    """<2 x float> [value, value]."""
    vector = builder.insert_element(
        ir.Constant(ir.VectorType(ir.FloatType(), 2), ir.Undefined), value, ir.Constant(I32, 0)
    )
    return builder.shuffle_vector(vector, vector, _order([0, 0]))


def _pair_factors(builder, block_a, block_b, code_scale):
    """<16 x float>: fl(dA * code_scale) in lanes 0-7, fl(dB * code_scale) in 8-15."""
    factors = builder.fmul(
        _pair_heads(builder, block_a, block_b, 0), _splat2(builder, code_scale), flags=EXACT
    )
    return builder.shuffle_vector(factors, factors, _order([0] * 8 + [1] * 8))


def _activation(builder, a_ptr, offset: int):
    """(<64 x i8> the group's 32 codes twice, <16 x i32> minus ``offset`` times each lane's
    four: vpdpbusd's starting value for codes stored plus ``offset``)."""
    a = builder.load(builder.bitcast(a_ptr, ir.VectorType(I8, 32).as_pointer()), align=1)
    twice = builder.shuffle_vector(a, a, _order(list(range(32)) * 2))
    words = ir.VectorType(I32, WIDE)
    zero = ir.Constant(words, None)
    if not offset:
        return twice, zero
    offsets = builder.bitcast(ir.Constant(twice.type, [offset] * 64), words)
    quads = _call(
        builder, "llvm.x86.avx512.vpdpbusd.512", words, [zero, offsets, builder.bitcast(twice, words)]
    )
    return twice, builder.sub(zero, quads)


def pair_dots(builder, kind: str, pairs, a0, d0, n_groups, group_sums=None):
    """[[row A's sum, row B's sum] for each (block_a, block_b) of ``pairs``] over ``n_groups``
    blocks of ``kind`` (i8 pointers) with activation codes at ``a0``, their group scales at
    ``d0`` and (Q4_1) group sums at ``group_sums``: the values intdot_ir.row_dots gives each
    row, min terms included (module docstring). Several pairs share the activation's load and
    offset term, and their sums are independent chains."""
    floats, words = ir.VectorType(ir.FloatType(), WIDE), ir.VectorType(I32, WIDE)
    accs = [cgutils.alloca_once_value(builder, ir.Constant(floats, None)) for _ in pairs]
    with_mins = kind == Q4_1
    chain_type = ir.VectorType(ir.FloatType(), 2)
    chains = (
        [cgutils.alloca_once_value(builder, ir.Constant(chain_type, None)) for _ in pairs]
        if with_mins
        else []
    )
    with cgutils.for_range(builder, n_groups) as loop:
        g = loop.index
        w_at = builder.mul(g, ir.Constant(g.type, LAYOUT[kind].stride))
        a_at = builder.gep(a0, [builder.mul(g, ir.Constant(g.type, 32))])
        twice, start = _activation(builder, a_at, CODE_OFFSET[kind])
        code_scale = builder.load(builder.gep(d0, [g]))
        group_sum = _splat2(builder, builder.load(builder.gep(group_sums, [g]))) if with_mins else None
        for p, (block_a, block_b) in enumerate(pairs):
            first, second = builder.gep(block_a, [w_at]), builder.gep(block_b, [w_at])
            codes = _pair_codes(builder, kind, first, second)
            lanes = _call(
                builder,
                "llvm.x86.avx512.vpdpbusd.512",
                words,
                [start, builder.bitcast(codes, words), builder.bitcast(twice, words)],
            )
            factors = _pair_factors(builder, first, second, code_scale)
            step = _call(
                builder,
                "llvm.fma.v16f32",
                floats,
                [builder.sitofp(lanes, floats), factors, builder.load(accs[p])],
            )
            builder.store(step, accs[p])
            if with_mins:  # min_sum's chain, one lane per row: fma(m, group sum, chain)
                mins = _pair_heads(builder, first, second, 1)
                chain = _call(
                    builder, "llvm.fma.v2f32", chain_type, [mins, group_sum, builder.load(chains[p])]
                )
                builder.store(chain, chains[p])
    sums = []
    for p, acc in enumerate(accs):
        total = builder.load(acc)
        halves = [builder.shuffle_vector(total, total, _order(list(range(h, h + 8)))) for h in (0, 8)]
        row_sums = [lane_sum(builder, half) for half in halves]
        if with_mins:
            chain = builder.load(chains[p])
            row_sums = [
                builder.fadd(s, builder.extract_element(chain, ir.Constant(I32, i)), flags=EXACT)
                for i, s in enumerate(row_sums)
            ]
        sums.append(row_sums)
    return sums
