"""LLVM IR of a register tile: several weight rows times several activation rows per group.

Prefill multiplies every weight row with many activation rows. intdot_ir.row_dots already
computes each (weight row, activation row) pair with the instructions of the one-row kernel;
this module adds the AVX-512 form of the same arithmetic, where one 512-bit vector carries the
8 lanes of TWO weight rows (lanes 0-7 the first, 8-15 the second) against one activation row:

- integer lanes by ``vpdpbusd`` (groups of 32) or ``vpdpwssd`` (groups of 16, codes widened to
  int16: lane j = products 2j and 2j + 1, ggml's pmaddubsw/pmaddwd fold), exact int32. For
  signed weight codes the unsigned operand is the activation moved up by 128 (``a ^ 0x80``),
  and the accumulator starts at -128 * (the four weight codes' sum) per lane, computed once per
  weight group for all activation rows: sum (a + 128) w - 128 sum w = sum a w, no psign per
  pair. Unsigned 4-bit codes (offset 0) are the unsigned operand as they are;
- the combined scale fl(scale * code scale) as one vector multiply of the weight pair's two
  scales (each in its 8 lanes, prepared once per group) by the activation row's scale;
- lane-wise FMA into the pair's accumulator, and each half summed in ggml's order at the end.

Every lane sees the integers, products and roundings of the one-row kernel, in the same order:
the same bits, with about a third of its instructions per product.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from .codes import GroupCodes
from .intdot_ir import (
    EXACT,
    I8,
    I16,
    I32,
    LANES,
    _at,
    _call,
    _constant_vector,
    _load_codes,
    _load_nibbles,
    _load_quint,
    _quint_scale,
)

WIDE = 2 * LANES  # float lanes of a 512-bit vector: two weight rows' eight
FLOATS = ir.VectorType(ir.FloatType(), WIDE)
WORDS = ir.VectorType(I32, WIDE)


def _concat(builder, low, high):
    n = low.type.count
    return builder.shuffle_vector(low, high, _constant_vector(list(range(2 * n))))


def _twice(builder, value):
    """A vector followed by itself (one activation group against both rows of a pair)."""
    n = value.type.count
    return builder.shuffle_vector(value, value, _constant_vector(list(range(n)) * 2))


def _splat(builder, scalar, n: int):
    vector = ir.VectorType(scalar.type, n)
    one = builder.insert_element(ir.Constant(vector, ir.Undefined), scalar, ir.Constant(I32, 0))
    return builder.shuffle_vector(one, one, _constant_vector([0] * n))


def _pair_scales(builder, s_first, s_second):
    """<16 x float>: the first row's scale in lanes 0-7, the second's in lanes 8-15."""
    both = builder.insert_element(ir.Constant(FLOATS, ir.Undefined), s_first, ir.Constant(I32, 0))
    both = builder.insert_element(both, s_second, ir.Constant(I32, 1))
    return builder.shuffle_vector(both, both, _constant_vector([0] * LANES + [1] * LANES))


def _fma(builder, a, b, c):
    """a * b + c per lane, rounded once (the one-row kernel's llvm.fma, 16 lanes)."""
    return _call(builder, f"llvm.fma.v{WIDE}f32", FLOATS, [a, b, c])


def _dpbusd(builder, acc, unsigned, signed):
    args = [acc, builder.bitcast(unsigned, WORDS), builder.bitcast(signed, WORDS)]
    return _call(builder, "llvm.x86.avx512.vpdpbusd.512", WORDS, args)


def _dpwssd(builder, acc, first, second):
    args = [acc, builder.bitcast(first, WORDS), builder.bitcast(second, WORDS)]
    return _call(builder, "llvm.x86.avx512.vpdpwssd.512", WORDS, args)


class _PairGroup:
    """One group of a weight pair, prepared once for every activation row."""

    def __init__(self, builder, codes: GroupCodes, first, second, g):
        """first, second: (q pointer, scales pointer) of the pair's rows; g: the group index.
        A file block's codes and f16 scale, unpacked in registers, go through the arithmetic
        of int8 codes (Q5_0, Q8_0) or of unsigned nibbles (Q4_1; its mins are the caller's:
        prefill_tiles reads them)."""
        self.group, self.nibbles = codes.group, codes.unsigned
        at = builder.mul(g, ir.Constant(g.type, codes.stride))
        if codes.block is not None:  # a block a group: codes and scale from its bytes
            blocks = [builder.gep(q, [at]) for q, _ in (first, second)]
            rows = [self._block_codes(builder, block, codes) for block in blocks]
            scales = [_quint_scale(builder, block) for block in blocks]  # (all start with f16 d)
        else:
            rows = [self._codes(builder, builder.gep(q, [at])) for q, _ in (first, second)]
            scales = [builder.load(builder.gep(s, [g])) for _, s in (first, second)]
        self.codes = _concat(builder, *rows)  # <64 x i8> or <32 x i16>
        self.scales = _pair_scales(builder, *scales)  # <16 x float>
        zero = ir.Constant(WORDS, None)
        self.start = zero
        if self.group == 32 and not self.nibbles:  # signed codes: -128 * each lane's four codes
            moved = ir.Constant(ir.VectorType(I8, 64), [-128] * 64)
            self.start = builder.sub(zero, _dpbusd(builder, zero, moved, self.codes))

    @staticmethod
    def _block_codes(builder, block, codes: GroupCodes):
        """A Q5_0 or Q8_0 block's 32 signed codes, or a Q4_1 block's unsigned ones -> <32 x i8>."""
        if codes.five_bit:
            return _load_quint(builder, block, subtract=True)
        if codes.packed:
            return _load_nibbles(builder, _at(builder, block, codes.codes_at), 0)
        return _load_codes(builder, _at(builder, block, codes.codes_at), 32)

    def _codes(self, builder, pointer):
        if self.nibbles:
            return _load_nibbles(builder, pointer, 0)
        codes = _load_codes(builder, pointer, self.group)
        return builder.sext(codes, ir.VectorType(I16, 16)) if self.group == 16 else codes

    def lanes(self, builder, act):
        """The pair's 16 int32 lanes against one activation group (prepared by act_group)."""
        if self.group == 16:
            return _dpwssd(builder, self.start, self.codes, act)
        if self.nibbles:
            return _dpbusd(builder, self.start, self.codes, act)
        return _dpbusd(builder, self.start, act, self.codes)


def act_group(builder, group: int, nibbles: bool, a_ptr):
    """One activation row's group as every weight pair's product takes it: int16 for groups
    of 16, moved up by 128 against signed codes, as is against unsigned nibbles; twice."""
    a = _load_codes(builder, a_ptr, group)
    if group == 16:
        return _twice(builder, builder.sext(a, ir.VectorType(I16, 16)))
    if not nibbles:
        a = builder.xor(a, ir.Constant(a.type, [-128] * group))
    return _twice(builder, a)


def _half_sum(builder, total, first: int):
    """Lanes first..first+7 of ``total`` summed in ggml's hsum_float_8 order."""
    lane = [builder.extract_element(total, ir.Constant(I32, first + i)) for i in range(LANES)]
    r = [builder.fadd(lane[4 + i], lane[i], flags=EXACT) for i in range(4)]
    return builder.fadd(
        builder.fadd(r[0], r[2], flags=EXACT), builder.fadd(r[1], r[3], flags=EXACT), flags=EXACT
    )


def wide_tile_dots(builder, codes: GroupCodes, weight_rows, act_rows, n_groups):
    """For every weight row (q pointer, scales pointer; an even number of them) and activation
    row (codes pointer, code scales pointer): the one-row kernel's value, as row_dots returns
    it ([weight row][activation row] float32), through 512-bit vectors of weight pairs.
    ``codes``: int8 codes, unsigned 4-bit codes packed two a byte, or the file's Q5_0, Q8_0 or
    Q4_1 blocks (scale pointers unused; Q4_1's mins left out); not nibbles stored plus an
    offset."""
    assert len(weight_rows) % 2 == 0 and codes.group in (16, 32)
    assert codes.block is not None or codes.offset == 0
    group = codes.group
    pairs = [(weight_rows[i], weight_rows[i + 1]) for i in range(0, len(weight_rows), 2)]
    accs = [[cgutils.alloca_once_value(builder, ir.Constant(FLOATS, None)) for _ in act_rows] for _ in pairs]
    with cgutils.for_range(builder, n_groups) as loop:
        g = loop.index
        prepared = [_PairGroup(builder, codes, first, second, g) for first, second in pairs]
        a_at = builder.mul(g, ir.Constant(g.type, group))
        for t, (a0, d0) in enumerate(act_rows):
            act = act_group(builder, group, codes.unsigned, builder.gep(a0, [a_at]))
            code_scale = _splat(builder, builder.load(builder.gep(d0, [g])), WIDE)
            for pair, pair_accs in zip(prepared, accs, strict=True):
                factor = builder.fmul(pair.scales, code_scale, flags=EXACT)
                lanes = builder.sitofp(pair.lanes(builder, act), FLOATS)
                acc = pair_accs[t]
                builder.store(_fma(builder, lanes, factor, builder.load(acc)), acc)
    totals = [[builder.load(acc) for acc in pair_accs] for pair_accs in accs]
    if len(pairs) == 4 and len(act_rows) % 2 == 0:
        return _tile_sums(builder, totals)
    sums = []
    for pair_totals in totals:
        sums.append([_half_sum(builder, total, 0) for total in pair_totals])
        sums.append([_half_sum(builder, total, LANES) for total in pair_totals])
    return sums


def _add_picked(builder, first, second, high: list[int], low: list[int]):
    """fl(high lanes + low lanes), each list indexing the concatenation first | second."""
    pick_high = builder.shuffle_vector(first, second, _constant_vector(high))
    pick_low = builder.shuffle_vector(first, second, _constant_vector(low))
    return builder.fadd(pick_high, pick_low, flags=EXACT)


def _tile_sums(builder, totals):
    """_half_sum of both halves of every accumulator (totals[pair][activation row], four
    pairs, an even number of rows), as [weight row][activation row] scalars: the same adds
    of the same lanes in the same order, but each vector add doing 16 of them (42 shuffles
    and adds per two activation rows instead of 240 extracts and adds).

    Per activation row: r_i = l_{4+i} + l_i of each half of pairs (0, 1) and (2, 3) (lane
    h*8 + a*4 + i of X holds half h of pair a's r_i); then s_j = r_j + r_{j+2} (lane 2w + j
    of Y, w = 2 * pair + half, the weight row); then per two activation rows s_0 + s_1 (lane
    8t + w of Z, t the row of the two)."""
    step1_high = [a * 16 + h * 8 + 4 + i for h in range(2) for a in range(2) for i in range(4)]
    step1_low = [a * 16 + h * 8 + i for h in range(2) for a in range(2) for i in range(4)]

    def y_lane(w: int, i: int) -> int:  # where pair w // 2, half w % 2, r_i sits in X01 | X23
        pair, half = divmod(w, 2)
        return (16 if pair >= 2 else 0) + half * 8 + (pair % 2) * 4 + i

    step2_low = [y_lane(w, j) for w in range(8) for j in range(2)]
    step2_high = [y_lane(w, j + 2) for w in range(8) for j in range(2)]
    per_row = []
    for t in range(len(totals[0])):
        x01 = _add_picked(builder, totals[0][t], totals[1][t], step1_high, step1_low)
        x23 = _add_picked(builder, totals[2][t], totals[3][t], step1_high, step1_low)
        per_row.append(_add_picked(builder, x01, x23, step2_low, step2_high))  # r_j + r_{j+2}
    sums = [[None] * len(per_row) for _ in range(8)]
    for t in range(0, len(per_row), 2):
        s0 = [u * 16 + 2 * w for u in range(2) for w in range(8)]
        z = _add_picked(builder, per_row[t], per_row[t + 1], s0, [lane + 1 for lane in s0])
        for u in range(2):
            for w in range(8):
                sums[w][t + u] = builder.extract_element(z, ir.Constant(I32, u * 8 + w))
    return sums
