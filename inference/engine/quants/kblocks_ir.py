"""LLVM IR of a decode pair over Q4_K and Q6_K super-blocks read as the file packs them.

intdot_ir.row_dots walks a row group by group, each group's codes and float32 scale at a
fixed stride. A K-quant keeps 256 weights per super-block: f16 super-scales and small integer
sub-block scales (and mins), the codes split into bit fields. Here the loop runs over
super-blocks; inside one, every group (32 weights for Q4_K, 16 for Q6_K) is unrolled, its
codes unpacked from the block's fields in registers and its float32 scale formed as the
loader forms it (kquants.py: fl(d * sc), exact: an f16 times an integer of at most 6 bits;
a min -(dmin * m)). Per group the rest is row_dots' own: the same integer lanes
(group_lanes), fl(scale * code scale), an FMA into the row's 8 float lanes in group order,
the min chain fma(min, group sum, chain) for Q4_K, lane_sum plus the chain at the end. So
each row's product has the bits of the int8 / nibble copy's (dot_pair_int, dot_pair_min).

Q4_K (144 bytes): d, dmin (f16), 12 bytes of 6-bit scales and mins, 128 bytes qs: chunk c
(32 bytes) holds group 2c's codes in its low nibbles and group 2c + 1's in its high ones.
Q6_K (210 bytes): ql (128), qh (64), 16 int8 scales, d (f16). Per half h of 128 weights and
run k < 4 of 32: low nibble (k < 2) or high nibble of ql[64h + 32(k % 2) + l], plus bits 2k,
2k + 1 of qh[32h + l] as bits 4, 5; minus 32. A run is two groups of 16.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from .intdot_ir import EXACT, I8, I32, LANES, _call, _constant_vector, _fma, group_lanes, lane_sum
from .kquants import Q4_K, Q6_K

SUPER = 256  # weights of a super-block
# A super-block's bytes, and the byte offsets of its fields (kquants.py's layouts).
Q4K_BLOCK, Q4K_SCALES, Q4K_QS = Q4_K.type_size(), Q4_K.field_offset("scales"), Q4_K.field_offset("qs")
Q6K_BLOCK, Q6K_QH = Q6_K.type_size(), Q6_K.field_offset("qh")
Q6K_SCALES, Q6K_D = Q6_K.field_offset("scales"), Q6_K.field_offset("d")
KIND_Q4_K, KIND_Q6_K = "q4_k", "q6_k"
I64 = ir.IntType(64)
FLOAT = ir.FloatType()


def _at(builder, pointer, offset):
    return builder.gep(pointer, [ir.Constant(I64, offset)])


def _load_bytes(builder, pointer, offset: int, n: int):
    vector = ir.VectorType(I8, n)
    return builder.load(builder.bitcast(_at(builder, pointer, offset), vector.as_pointer()), align=1)


def _splat_bytes(value: int, n: int):
    return ir.Constant(ir.VectorType(I8, n), [value] * n)


def _half(builder, block, offset: int):
    """The f16 at byte ``offset`` of a block, widened to float32 (exact)."""
    pointer = builder.bitcast(_at(builder, block, offset), ir.HalfType().as_pointer())
    return builder.fpext(builder.load(pointer, align=1), FLOAT)


def _times(builder, super_scale, small, signed: bool):
    """[fl(super_scale * float(small[i]))] for a vector of small integers (exact products)."""
    floats = ir.VectorType(FLOAT, small.type.count)
    wide = builder.sitofp(small, floats) if signed else builder.uitofp(small, floats)
    splat = builder.insert_element(ir.Constant(floats, ir.Undefined), super_scale, ir.Constant(I32, 0))
    splat = builder.shuffle_vector(splat, splat, _constant_vector([0] * small.type.count))
    product = builder.fmul(splat, wide, flags=EXACT)
    return [builder.extract_element(product, ir.Constant(I32, i)) for i in range(small.type.count)]


def _q4k_small(builder, block):
    """A Q4_K block's 8 six-bit scales and 8 six-bit mins (kquants._six_bit_scales_mins) ->
    two <8 x i8>."""
    first, second, third = (_load_bytes(builder, block, Q4K_SCALES + 4 * i, 4) for i in range(3))
    six, low4, top2 = _splat_bytes(63, 4), _splat_bytes(15, 4), _splat_bytes(6, 4)
    four = _splat_bytes(4, 4)
    high_scales = builder.or_(builder.and_(third, low4), builder.shl(builder.lshr(first, top2), four))
    high_mins = builder.or_(builder.lshr(third, four), builder.shl(builder.lshr(second, top2), four))
    order = _constant_vector(list(range(8)))
    scales = builder.shuffle_vector(builder.and_(first, six), high_scales, order)  # (8,) i8
    mins = builder.shuffle_vector(builder.and_(second, six), high_mins, order)  # (8,) i8
    return scales, mins


def _q4k_scales_mins(builder, block):
    """A Q4_K block's 8 float32 scales fl(d * sc) and 8 mins -fl(dmin * m) (kquants.py)."""
    scales, mins = _q4k_small(builder, block)
    d, dmin = _half(builder, block, 0), _half(builder, block, 2)
    negated = [builder.fneg(m) for m in _times(builder, dmin, mins, signed=False)]
    return _times(builder, d, scales, signed=False), negated


def _q4k_group_codes(builder, block, j: int):
    """Group j's 32 codes (0..15) of a Q4_K block -> <32 x i8>."""
    chunk = _load_bytes(builder, block, Q4K_QS + 32 * (j // 2), 32)
    if j % 2:
        return builder.lshr(chunk, _splat_bytes(4, 32))
    return builder.and_(chunk, _splat_bytes(15, 32))


def _q6k_run_codes(builder, block, h: int, k: int):
    """Run k of half h of a Q6_K block: 32 codes -32..31 -> <32 x i8>."""
    ql = _load_bytes(builder, block, 64 * h + 32 * (k % 2), 32)
    low = builder.and_(ql, _splat_bytes(15, 32)) if k < 2 else builder.lshr(ql, _splat_bytes(4, 32))
    qh = _load_bytes(builder, block, Q6K_QH + 32 * h, 32)
    if 2 * k <= 4:
        high = builder.shl(qh, _splat_bytes(4 - 2 * k, 32)) if k < 2 else qh
    else:
        high = builder.lshr(qh, _splat_bytes(2 * k - 4, 32))
    codes = builder.or_(low, builder.and_(high, _splat_bytes(0x30, 32)))
    return builder.sub(codes, _splat_bytes(32, 32))


def _weights(builder, simd: str, codes, signed: bool):
    """prepare_weights' tuple for codes already in registers (intdot_ir.prepare_weights)."""
    n = codes.type.count
    if simd == "generic":
        return builder.sext(codes, ir.VectorType(I32, n)), None, 0
    if not signed:
        return codes, None, 0  # codes 0..15: their own magnitudes
    sign = "llvm.x86.avx2.psign.b" if n == 32 else "llvm.x86.ssse3.psign.b.128"
    return codes, _call(builder, sign, codes.type, [codes, codes]), 0


def _accumulate(builder, simd, group, weights, scale, a0, d0, g, acc):
    """row_dots' step of one group: acc = fma(float(lanes), fl(scale * code scale), acc)."""
    floats = ir.VectorType(FLOAT, LANES)
    factor = builder.fmul(scale, builder.load(builder.gep(d0, [g])), flags=EXACT)
    splat = builder.insert_element(ir.Constant(floats, ir.Undefined), factor, ir.Constant(I32, 0))
    splat = builder.shuffle_vector(splat, splat, _constant_vector([0] * LANES))
    a_ptr = builder.gep(a0, [builder.mul(g, ir.Constant(g.type, group))])
    lanes = group_lanes(builder, simd, group, weights, a_ptr)
    builder.store(_fma(builder, builder.sitofp(lanes, floats), splat, builder.load(acc)), acc)


def _q4k_block(builder, simd, block, first_group, a0, d0, sums0, acc, chain):
    """One Q4_K super-block of one row: its 8 groups into acc and the min chain."""
    scales, mins = _q4k_scales_mins(builder, block)
    for j in range(8):
        g = builder.add(first_group, ir.Constant(I64, j))
        codes = _q4k_group_codes(builder, block, j)
        _accumulate(builder, simd, 32, _weights(builder, simd, codes, False), scales[j], a0, d0, g, acc)
        step = _call(
            builder,
            "llvm.fma.f32",
            FLOAT,
            [mins[j], builder.load(builder.gep(sums0, [g])), builder.load(chain)],
        )
        builder.store(step, chain)


def _q6k_block(builder, simd, block, first_group, a0, d0, acc):
    """One Q6_K super-block of one row: its 16 groups of 16 into acc."""
    scales = _times(builder, _half(builder, block, Q6K_D), _load_bytes(builder, block, Q6K_SCALES, 16), True)
    for h in range(2):
        for k in range(4):
            codes = _q6k_run_codes(builder, block, h, k)
            for half in range(2):
                j = 8 * h + 2 * k + half
                part = builder.shuffle_vector(
                    codes, codes, _constant_vector(list(range(16 * half, 16 * half + 16)))
                )
                g = builder.add(first_group, ir.Constant(I64, j))
                _accumulate(builder, simd, 16, _weights(builder, simd, part, True), scales[j], a0, d0, g, acc)


def prefetch_lines(kind: str, n_rows: int) -> int:
    """Cache lines a super-block step of ``n_rows`` rows reads (rounded up): the share of a
    stretch ahead it prefetches so that the stretch keeps pace with the rows (prefetch_share)."""
    return -(-n_rows * (Q4K_BLOCK if kind == KIND_Q4_K else Q6K_BLOCK) // 64)


def prefetch_share(builder, ahead, sb) -> None:
    """Super-block ``sb``'s share of a stretch of memory to prefetch: ``ahead`` = (i8 pointer to
    the stretch, lines a super-block); lines [sb * lines, (sb + 1) * lines) of it into L2
    (prefetcht1). A decode step streams each matrix once; the prefetches the caller issued a
    unit of rows at a time came in bursts of ~250 lines into L1 (32 KB, overrun by them) and
    left two threads at ~15 GB/s where the bus gives ~35 (bench/lab/k_stream.py). Spread over
    the loop, a few lines per super-block, into L2: ~40 (docs/BENCHMARKS.md)."""
    pointer, lines = ahead
    first = builder.mul(sb, ir.Constant(sb.type, 64 * lines))
    i32 = ir.IntType(32)
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [pointer.type, i32, i32, i32]), "llvm.prefetch.p0i8"
    )
    for i in range(lines):  # (read, locality 2: prefetcht1, data)
        at = builder.gep(pointer, [builder.add(first, ir.Constant(sb.type, 64 * i))])
        builder.call(fn, [at, ir.Constant(i32, 0), ir.Constant(i32, 2), ir.Constant(i32, 1)])


def kblock_pair_dots(builder, simd: str, kind: str, rows, a0, d0, sums0, n_super, ahead=None):
    """[each row's product] for weight rows of ``kind`` blocks (i8 pointers ``rows``) with one
    activation row: codes at ``a0``, code scales per group at ``d0``, group sums at ``sums0``
    (Q4_K's min terms). The values row_dots gives the int8 / nibble copy (module docstring).
    ``ahead``: (i8 pointer, lines a super-block) of a stretch to prefetch (prefetch_share)."""
    floats = ir.VectorType(FLOAT, LANES)
    accs = [cgutils.alloca_once_value(builder, ir.Constant(floats, None)) for _ in rows]
    chains = [cgutils.alloca_once_value(builder, ir.Constant(FLOAT, 0.0)) for _ in rows]
    block_bytes, groups = (Q4K_BLOCK, 8) if kind == KIND_Q4_K else (Q6K_BLOCK, 16)
    with cgutils.for_range(builder, n_super) as loop:
        s = loop.index
        w_at = builder.mul(s, ir.Constant(s.type, block_bytes))
        first_group = builder.mul(s, ir.Constant(s.type, groups))
        if ahead is not None:
            prefetch_share(builder, ahead, s)
        for row, acc, chain in zip(rows, accs, chains, strict=True):
            block = builder.gep(row, [w_at])
            if kind == KIND_Q4_K:
                _q4k_block(builder, simd, block, first_group, a0, d0, sums0, acc, chain)
            else:
                _q6k_block(builder, simd, block, first_group, a0, d0, acc)
    totals = [lane_sum(builder, builder.load(acc)) for acc in accs]
    if kind != KIND_Q4_K:
        return totals
    return [builder.fadd(t, builder.load(c), flags=EXACT) for t, c in zip(totals, chains, strict=True)]
