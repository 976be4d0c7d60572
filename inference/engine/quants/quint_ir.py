"""LLVM IR of a decode pair over Q5_0 blocks with both weight rows in one 512-bit register.

intdot_ir.row_dots handles a pair as two 256-bit streams: per group and row a nibble unpack,
a fifth-bit merge, a scale widening and multiply, vpdpbusd, a convert and an FMA, ~16
instructions a row; one thread then runs ALU-bound at ~24 Gweights/s, below what the file's
22 bytes per 32 weights let two threads stream. Here row A's group fills the low 256 bits and
row B's the high 256, so each step runs once for both rows:

    codes  = nibbles of [A.qs, A.qs, B.qs, B.qs] (low, high, low, high: vgf2p8affineqb),
             + 16 where the bit of [A.qh, B.qh] is set (a merge-masked vpaddb)
    lanes  = vpdpbusd(-16 * quad sums of a, codes, [a, a])          (the offset, as intdot_ir)
    acc    = fma(float(lanes), [fl(dA * d_a) x 8, fl(dB * d_a) x 8], acc)

Lanes 0-7 are row A's lanes of intdot_ir (lane j: codes 4j..4j+3), lanes 8-15 row B's, and
every lane sees the same operations in the same order, so each row's sum (lane_sum of its
half) has the bits of the int8 copy's. Needs AVX-512 BW, VNNI and GFNI (``fits``). One thread
from L2 (bench/q5_stream.py --rows 1024 --passes 400 --threads 1): 44 Gweights/s, against 27
for two 256-bit streams and 54 for the int8 copy's pair; the fifth bits built in a general
register (kmovq) or the scales inserted as scalars (vpinsrw) cost ~1.5x each.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from .intdot_ir import EXACT, I8, I32, QUINT_BLOCK, QUINT_OFFSET, QUINT_QH, QUINT_QS, _call, lane_sum

WIDE = 16  # int32 / float lanes of one 512-bit register
I64 = ir.IntType(64)
NEEDED_FEATURES = ("avx512bw", "avx512vnni", "avx512vl", "gfni")
# vgf2p8affineqb matrices (bit i of a result byte = parity of the matrix's byte 7 - i and
# the source byte): the low nibble, and the high nibble moved down.
_LOW_NIBBLE, _HIGH_NIBBLE = 0x0102040800000000, 0x1020408000000000


def fits(features: frozenset[str]) -> bool:
    """Whether the CPU runs this kernel (512-bit byte ops and vpdpbusd)."""
    return all(f in features for f in NEEDED_FEATURES)


def _byte_pointer(builder, block, offset: int, vector_type):
    return builder.bitcast(builder.gep(block, [ir.Constant(I64, offset)]), vector_type.as_pointer())


def _pair_codes(builder, block_a, block_b):
    """<64 x i8>: row A's 32 codes then row B's, stored plus 16 (0..31)."""
    qs_type = ir.VectorType(I8, 16)
    qs_a = builder.load(_byte_pointer(builder, block_a, QUINT_QS, qs_type), align=1)
    qs_b = builder.load(_byte_pointer(builder, block_b, QUINT_QS, qs_type), align=1)
    order = list(range(16)) * 2 + list(range(16, 32)) * 2
    both = builder.shuffle_vector(qs_a, qs_b, ir.Constant(ir.VectorType(I32, 64), order))  # (64,) bytes
    # One GF(2) affine map per byte picks its low nibble (128-bit lanes 0, 2) or its high one
    # (lanes 1, 3: codes 16..31), in place of a variable shift and an and.
    matrices = ir.Constant(ir.VectorType(I64, 8), ([_LOW_NIBBLE] * 2 + [_HIGH_NIBBLE] * 2) * 2)
    nibbles = _call(
        builder, "llvm.x86.vgf2p8affineqb.512", both.type,
        [both, builder.bitcast(matrices, both.type), ir.Constant(I8, 0)],
    )  # fmt: skip
    mask_type = ir.VectorType(ir.IntType(1), 32)
    # Two mask loads joined (kunpckdq): built in a general register (shift, or, kmovq) the
    # mask cost ~1.5x the kernel's time, the moves from general registers being scarce.
    bits_a = builder.load(_byte_pointer(builder, block_a, QUINT_QH, mask_type), align=1)
    bits_b = builder.load(_byte_pointer(builder, block_b, QUINT_QH, mask_type), align=1)
    bits = builder.shuffle_vector(bits_a, bits_b, ir.Constant(ir.VectorType(I32, 64), list(range(64))))
    # + 16 where the bit is set, as select(bits, nibbles + 16, nibbles): one merge-masked
    # vpaddb (an or, then a masked move, was one instruction more)
    return builder.select(bits, builder.add(nibbles, ir.Constant(both.type, [16] * 64)), nibbles)


def _pair_factors(builder, block_a, block_b, code_scale):
    """<16 x float>: fl(dA * code_scale) in lanes 0-7, fl(dB * code_scale) in 8-15."""
    half = ir.HalfType()
    # Vector loads of the blocks' first 16 bytes and one word shuffle: two scalar halves
    # inserted (vpinsrw) cost as much again as the mask built in a general register.
    eight = ir.VectorType(half, 8)
    head_a = builder.load(builder.bitcast(block_a, eight.as_pointer()), align=1)
    head_b = builder.load(builder.bitcast(block_b, eight.as_pointer()), align=1)
    pair = builder.shuffle_vector(head_a, head_b, ir.Constant(ir.VectorType(I32, 2), [0, 8]))
    widened = builder.fpext(pair, ir.VectorType(ir.FloatType(), 2))  # exact
    splat = builder.insert_element(ir.Constant(widened.type, ir.Undefined), code_scale, ir.Constant(I32, 0))
    splat = builder.shuffle_vector(splat, splat, ir.Constant(ir.VectorType(I32, 2), [0, 0]))
    factors = builder.fmul(widened, splat, flags=EXACT)
    return builder.shuffle_vector(factors, factors, ir.Constant(ir.VectorType(I32, WIDE), [0] * 8 + [1] * 8))


def _activation(builder, a_ptr):
    """(<64 x i8> the group's 32 codes twice, <16 x i32> minus 16 times each lane's four)."""
    a = builder.load(builder.bitcast(a_ptr, ir.VectorType(I8, 32).as_pointer()), align=1)
    twice = builder.shuffle_vector(a, a, ir.Constant(ir.VectorType(I32, 64), list(range(32)) * 2))
    words = ir.VectorType(I32, WIDE)
    zero = ir.Constant(words, None)
    sixteens = builder.bitcast(ir.Constant(twice.type, [QUINT_OFFSET] * 64), words)
    quads = _call(
        builder, "llvm.x86.avx512.vpdpbusd.512", words, [zero, sixteens, builder.bitcast(twice, words)]
    )
    return twice, builder.sub(zero, quads)


def quint_pair_dots(builder, pairs, a0, d0, n_groups):
    """[[row A's sum, row B's sum] for each (block_a, block_b) of ``pairs``] over ``n_groups``
    Q5_0 blocks (i8 pointers) with activation codes at ``a0`` and their group scales at
    ``d0``: the values intdot_ir.row_dots gives each row (module docstring). Several pairs
    share the activation's load and offset term, and their sums are independent chains."""
    floats, words = ir.VectorType(ir.FloatType(), WIDE), ir.VectorType(I32, WIDE)
    accs = [cgutils.alloca_once_value(builder, ir.Constant(floats, None)) for _ in pairs]
    with cgutils.for_range(builder, n_groups) as loop:
        g = loop.index
        w_at = builder.mul(g, ir.Constant(g.type, QUINT_BLOCK))
        twice, offset = _activation(builder, builder.gep(a0, [builder.mul(g, ir.Constant(g.type, 32))]))
        code_scale = builder.load(builder.gep(d0, [g]))
        for (block_a, block_b), acc in zip(pairs, accs, strict=True):
            first, second = builder.gep(block_a, [w_at]), builder.gep(block_b, [w_at])
            codes = _pair_codes(builder, first, second)
            lanes = _call(
                builder, "llvm.x86.avx512.vpdpbusd.512", words,
                [offset, builder.bitcast(codes, words), builder.bitcast(twice, words)],
            )  # fmt: skip
            factors = _pair_factors(builder, first, second, code_scale)
            step = _call(
                builder,
                "llvm.fma.v16f32",
                floats,
                [builder.sitofp(lanes, floats), factors, builder.load(acc)],
            )
            builder.store(step, acc)
    sums = []
    for acc in accs:
        total = builder.load(acc)
        halves = [
            builder.shuffle_vector(total, total, ir.Constant(ir.VectorType(I32, 8), list(range(h, h + 8))))
            for h in (0, 8)
        ]
        sums.append([lane_sum(builder, half) for half in halves])
    return sums
