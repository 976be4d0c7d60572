"""LLVM IR of a decode pair over Q4_K / Q6_K super-blocks with both weight rows in one 512-bit
register (kblocks_ir.py's products, the same bits, fewer instructions).

kblocks_ir runs each row's groups as intdot_ir does, 256 or 128 bits at a time: one thread
then computes Q6_K at ~15 Gweights/s from L2, below the int8 copy's 24 (bench/lab/k_stream.py).
Here row A's codes fill the low half of a register and row B's the high half (as wide_ir
does for Q5_0), so each step runs once for both rows:

- Q4_K, group j of a super-block: codes [A's 32 | B's 32] (a nibble of the chunk's bytes),
  lanes = vpdpbusd(0, codes, [a, a]): lanes 0-7 row A's lanes of intdot_ir, 8-15 row B's.
- Q6_K, run of 32 (two groups of 16): codes stored plus 32 (0..63), [A | B];
  pmaddubsw(codes, [a, a]) - pmaddubsw(32, [a, a]) = per int16 w0 a0 + w1 a1 exactly (at
  most 63 * 127 * 2 before the subtraction: no saturation), the groups' lanes of intdot_ir's
  avx2 sequence; widened and rearranged to [A's group | B's group] per group.

The float steps are the scalar kernel's per lane: factor fl(fl(d * sc) * code scale) (the
scales of a super-block formed as one vector, each lane one correctly rounded product),
acc = fma(float(lanes), factor, acc) in group order, Q4_K's min chain fma(min, group sum,
chain) per row (a two-lane fma), lane_sum of each half plus the chain. Needs AVX-512 BW and
VNNI (wide_ir.fits).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from .intdot_ir import EXACT, I8, I16, I32, _call, lane_sum
from .kblocks_ir import (
    KIND_Q4_K,
    Q4K_BLOCK,
    Q4K_QS,
    Q6K_BLOCK,
    Q6K_D,
    Q6K_QH,
    Q6K_SCALES,
    _q4k_small,
    prefetch_share,
)

WIDE = 16  # float / int32 lanes of a 512-bit register
I64 = ir.IntType(64)
FLOAT = ir.FloatType()


def _order(values):
    return ir.Constant(ir.VectorType(I32, len(values)), values)


def _splat(builder, value, n: int):
    vector = ir.VectorType(value.type, n)
    one = builder.insert_element(ir.Constant(vector, ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(one, one, _order([0] * n))


def _bytes(builder, pointer, offset, n: int):
    at = builder.gep(pointer, [ir.Constant(I64, offset)]) if isinstance(offset, int) else pointer
    return builder.load(builder.bitcast(at, ir.VectorType(I8, n).as_pointer()), align=1)


def _joined(builder, a_part, b_part):
    """Two <n x T> joined as <2n x T> (A's then B's)."""
    n = a_part.type.count
    return builder.shuffle_vector(a_part, b_part, _order(list(range(2 * n))))


def _half_pair(builder, block_a, block_b, offset: int):
    """<16 x float>: block A's f16 at ``offset`` widened in lanes 0-7, block B's in 8-15."""
    halves = []
    for block in (block_a, block_b):
        pointer = builder.bitcast(builder.gep(block, [ir.Constant(I64, offset)]), ir.HalfType().as_pointer())
        halves.append(builder.load(pointer, align=1))
    pair = builder.insert_element(
        ir.Constant(ir.VectorType(ir.HalfType(), 2), ir.Undefined), halves[0], ir.Constant(I32, 0)
    )
    pair = builder.insert_element(pair, halves[1], ir.Constant(I32, 1))
    wide = builder.fpext(pair, ir.VectorType(FLOAT, 2))  # exact
    return builder.shuffle_vector(wide, wide, _order([0] * 8 + [1] * 8))


def _group_factor(builder, factors, j: int, per_row: int):
    """<16 x float>: row A's factor of group j in lanes 0-7, row B's in 8-15 (``factors``:
    A's per_row factors, then B's)."""
    return builder.shuffle_vector(factors, factors, _order([j] * 8 + [per_row + j] * 8))


def _step(builder, lanes, factor, acc):
    floats = ir.VectorType(FLOAT, WIDE)
    step = _call(
        builder, "llvm.fma.v16f32", floats, [builder.sitofp(lanes, floats), factor, builder.load(acc)]
    )
    builder.store(step, acc)


def _twice(builder, a_ptr):
    """<64 x i8>: the 32 activation codes at a_ptr, twice."""
    a = _bytes(builder, a_ptr, 0, 32)
    return _joined(builder, a, a)


def _q4k_factors(builder, block_a, block_b, code_scales):
    """A Q4_K pair's factors fl(fl(d * sc) * code scale) and mins -fl(dmin * m): <16 x float>
    each, A's 8 then B's."""
    small = [_q4k_small(builder, block) for block in (block_a, block_b)]  # [(scales, mins) (8,) i8]
    floats = ir.VectorType(FLOAT, WIDE)
    scales = builder.uitofp(_joined(builder, small[0][0], small[1][0]), floats)
    mins = builder.uitofp(_joined(builder, small[0][1], small[1][1]), floats)
    scales = builder.fmul(_half_pair(builder, block_a, block_b, 0), scales, flags=EXACT)
    mins = builder.fneg(builder.fmul(_half_pair(builder, block_a, block_b, 2), mins, flags=EXACT))
    return builder.fmul(scales, _joined(builder, code_scales, code_scales), flags=EXACT), mins


def _q4k_super(builder, pairs, a0, d0, sums0, sb, accs, chains):
    """One super-block of Q4_K row pairs: 8 groups into each pair's acc (16 lanes) and chains."""
    first = builder.mul(sb, ir.Constant(I64, 8))
    code_scales = builder.load(
        builder.bitcast(builder.gep(d0, [first]), ir.VectorType(FLOAT, 8).as_pointer()), align=4
    )
    per_pair = [_q4k_factors(builder, a, b, code_scales) for a, b in pairs]
    words, zero = ir.VectorType(I32, WIDE), ir.Constant(ir.VectorType(I32, WIDE), None)
    for j in range(8):
        g = builder.add(first, ir.Constant(I64, j))
        aa = builder.bitcast(_twice(builder, builder.gep(a0, [builder.mul(g, ir.Constant(I64, 32))])), words)
        group_sum = _splat(builder, builder.load(builder.gep(sums0, [g])), 2)
        for (block_a, block_b), (factors, mins), acc, chain in zip(
            pairs, per_pair, accs, chains, strict=True
        ):
            chunk = [_bytes(builder, block, Q4K_QS + 32 * (j // 2), 32) for block in (block_a, block_b)]
            packed = _joined(builder, *chunk)
            nibbles = builder.lshr(packed, ir.Constant(packed.type, [4] * 64)) if j % 2 else packed
            codes = builder.and_(nibbles, ir.Constant(packed.type, [15] * 64))
            lanes = _call(
                builder, "llvm.x86.avx512.vpdpbusd.512", words, [zero, builder.bitcast(codes, words), aa]
            )
            _step(builder, lanes, _group_factor(builder, factors, j, 8), acc)
            pair_mins = builder.shuffle_vector(mins, mins, _order([j, 8 + j]))
            step = _call(
                builder, "llvm.fma.v2f32", pair_mins.type, [pair_mins, group_sum, builder.load(chain)]
            )
            builder.store(step, chain)


def _q6k_run(builder, block_a, block_b, h: int, k: int):
    """<64 x i8>: run k of half h of rows A and B, codes stored plus 32 (0..63)."""
    ql = _joined(builder, *(_bytes(builder, b, 64 * h + 32 * (k % 2), 32) for b in (block_a, block_b)))
    qh = _joined(builder, *(_bytes(builder, b, Q6K_QH + 32 * h, 32) for b in (block_a, block_b)))
    bytes64 = ql.type
    low = builder.lshr(ql, ir.Constant(bytes64, [4] * 64)) if k >= 2 else ql
    low = builder.and_(low, ir.Constant(bytes64, [15] * 64))
    if k < 2:
        high = builder.shl(qh, ir.Constant(bytes64, [4 - 2 * k] * 64))
    elif k == 2:
        high = qh
    else:
        high = builder.lshr(qh, ir.Constant(bytes64, [2] * 64))
    return builder.or_(low, builder.and_(high, ir.Constant(bytes64, [0x30] * 64)))


def _q6k_factors(builder, block_a, block_b, code_scales):
    """A Q6_K pair's factors fl(fl(d * sc) * code scale): <32 x float>, A's 16 then B's."""
    small = _joined(builder, *(_bytes(builder, b, Q6K_SCALES, 16) for b in (block_a, block_b)))
    halves = _half_pair(builder, block_a, block_b, Q6K_D)
    d = builder.shuffle_vector(halves, halves, _order([0] * 16 + [8] * 16))
    scales = builder.fmul(d, builder.sitofp(small, ir.VectorType(FLOAT, 32)), flags=EXACT)
    return builder.fmul(scales, _joined(builder, code_scales, code_scales), flags=EXACT)


def _q6k_super(builder, pairs, a0, d0, sb, accs):
    """One super-block of Q6_K row pairs: 16 groups of 16 into each pair's acc (16 lanes)."""
    first = builder.mul(sb, ir.Constant(I64, 16))
    code_scales = builder.load(
        builder.bitcast(builder.gep(d0, [first]), ir.VectorType(FLOAT, 16).as_pointer()), align=4
    )
    per_pair = [_q6k_factors(builder, a, b, code_scales) for a, b in pairs]
    shorts = ir.VectorType(I16, 32)
    thirty_twos = ir.Constant(ir.VectorType(I8, 64), [32] * 64)
    for h in range(2):
        for k in range(4):
            run = 8 * h + 2 * k  # the run's first group in the super-block
            at = builder.mul(builder.add(first, ir.Constant(I64, run)), ir.Constant(I64, 16))
            aa = _twice(builder, builder.gep(a0, [at]))
            offsets = _call(builder, "llvm.x86.avx512.pmaddubs.w.512", shorts, [thirty_twos, aa])
            for (block_a, block_b), factors, acc in zip(pairs, per_pair, accs, strict=True):
                codes = _q6k_run(builder, block_a, block_b, h, k)
                products = _call(builder, "llvm.x86.avx512.pmaddubs.w.512", shorts, [codes, aa])
                pairs16 = builder.sub(products, offsets)  # (32,) i16: A's two groups, B's two
                for half in range(2):
                    order = [8 * half + i for i in range(8)] + [16 + 8 * half + i for i in range(8)]
                    picked = builder.shuffle_vector(pairs16, pairs16, _order(order))
                    lanes = builder.sext(picked, ir.VectorType(I32, WIDE))
                    _step(builder, lanes, _group_factor(builder, factors, run + half, 16), acc)


def wide_pair_dots(builder, kind: str, pairs, a0, d0, sums0, n_super, ahead=None):
    """[[row A's product, row B's] for each (block_a, block_b) i8 pointers of ``pairs``] over
    ``kind`` super-blocks with one activation row (codes ``a0``, code scales ``d0``, group sums
    ``sums0``). Several pairs share the activation's work; their sums are independent chains
    (each pair's FMAs wait on its own last: two pairs keep twice the FMAs in flight).
    ``ahead``: (i8 pointer, lines a super-block) of a stretch to prefetch, kblocks_ir's
    prefetch_share."""
    floats = ir.VectorType(FLOAT, WIDE)
    accs = [cgutils.alloca_once_value(builder, ir.Constant(floats, None)) for _ in pairs]
    chains = [cgutils.alloca_once_value(builder, ir.Constant(ir.VectorType(FLOAT, 2), None)) for _ in pairs]
    block_bytes = Q4K_BLOCK if kind == KIND_Q4_K else Q6K_BLOCK
    with cgutils.for_range(builder, n_super) as loop:
        sb = loop.index
        at = builder.mul(sb, ir.Constant(sb.type, block_bytes))
        blocks = [(builder.gep(a, [at]), builder.gep(b, [at])) for a, b in pairs]
        if ahead is not None:
            prefetch_share(builder, ahead, sb)
        if kind == KIND_Q4_K:
            _q4k_super(builder, blocks, a0, d0, sums0, sb, accs, chains)
        else:
            _q6k_super(builder, blocks, a0, d0, sb, accs)
    results = []
    for acc, chain in zip(accs, chains, strict=True):
        total, pair_chain = builder.load(acc), builder.load(chain)
        sums = []
        for row in range(2):
            half = builder.shuffle_vector(total, total, _order(list(range(8 * row, 8 * row + 8))))
            value = lane_sum(builder, half)
            if kind == KIND_Q4_K:
                extra = builder.extract_element(pair_chain, ir.Constant(I32, row))
                value = builder.fadd(value, extra, flags=EXACT)
            sums.append(value)
        results.append(sums)
    return results
