"""LLVM IR of the integer group dot products (intdot.py), for numba intrinsics.

Per group of 16 or 32 weights: the exact int32 sum of int8 weight codes times int8 activation
codes, folded to 8 int32 lanes the way ggml's AVX2 kernels fold them, converted to float,
multiplied by the group's combined scale and accumulated with a fused multiply-add; at the end
the 8 lanes are summed in ggml's hsum_float_8 order. Two instruction selections give the same
integer lanes, so the same bits:

- ``avx2``: ggml's own sequence, |w| (``psign``) times sign-moved a (``pmaddubsw``, two
  products per int16; |w| <= 128 and |a| <= 127 never saturate), then pairs to int32
  (``pmaddwd``): 32 multiply-adds in three instructions;
- ``vnni``: for groups of 32, ``vpdpbusd`` (AVX-512 VNNI + VL, or AVX-VNNI) sums four
  products |w| x sign-moved a into each int32 lane in one instruction: the avx2 lanes exactly
  (no saturation). Unsigned codes need no sign moved; 4-bit codes stored plus an offset
  (Q4_0's 8) are multiplied as stored with -offset * (sums of four a's) as the accumulator,
  which is sum (w - offset) a again. Groups of 16 fold in pairs, which vpdpbusd does not: they
  keep the avx2 sequence;
- ``generic``: sign-extend both to int32, multiply, add lane pairs, which LLVM lowers to the
  best the CPU has (``pmaddwd`` on SSE2 and up). Chosen when the CPU lacks AVX2.

The selection is chosen once per process (simd.py).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from .codes import Q5_0_BLOCKS, GroupCodes

LANES = 8
# Float operations carry this flag, which changes no result: numba's fastmath pass adds its
# reassociating flags only to instructions that have none, and this code can end up inside a
# fastmath kernel, where the one-row and the multi-row sums would then be reordered differently.
EXACT = ("ninf",)
I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)


def _constant_vector(values: list[int]) -> ir.Constant:
    return ir.Constant(ir.VectorType(I32, len(values)), values)


def _call(builder, name: str, result_type, args):
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(result_type, [a.type for a in args]), name
    )
    return builder.call(fn, args)


def _load_codes(builder, pointer, group: int):
    return builder.load(builder.bitcast(pointer, ir.VectorType(I8, group).as_pointer()), align=1)


def _load_nibbles(builder, pointer, offset: int):
    """A group of 32 codes from 16 bytes: code j in the low nibble of byte j, code j + 16 in
    its high nibble (Q4_0's layout), each minus ``offset`` -> <32 x i8>."""
    packed = builder.load(builder.bitcast(pointer, ir.VectorType(I8, 16).as_pointer()), align=1)
    low = builder.and_(packed, ir.Constant(packed.type, [0x0F] * 16))
    high = builder.lshr(packed, ir.Constant(packed.type, [4] * 16))
    codes = builder.shuffle_vector(low, high, _constant_vector(list(range(32))))
    return builder.sub(codes, ir.Constant(codes.type, [offset] * 32)) if offset else codes


def _at(builder, pointer, offset: int):
    """pointer + offset bytes (pointer itself for 0)."""
    return builder.gep(pointer, [ir.Constant(ir.IntType(64), offset)]) if offset else pointer


def _load_quint(builder, block, subtract: bool):
    """A Q5_0 block's 32 codes (0..31: the nibbles of qs, bit j of qh the fifth bit of code
    j), minus the stored offset if ``subtract`` -> <32 x i8>. AVX-512 turns the bit select
    into a mask move and a masked byte move."""
    layout = Q5_0_BLOCKS
    codes = _load_nibbles(builder, _at(builder, block, layout.codes_at), 0)
    word = _at(builder, block, layout.fifth_bits_at)
    fifth = builder.load(builder.bitcast(word, I32.as_pointer()), align=1)
    bits = builder.bitcast(fifth, ir.VectorType(ir.IntType(1), 32))
    codes = builder.or_(
        codes, builder.select(bits, ir.Constant(codes.type, [16] * 32), ir.Constant(codes.type, None))
    )
    return builder.sub(codes, ir.Constant(codes.type, [layout.offset] * 32)) if subtract else codes


def _quint_scale(builder, block):
    """A Q5_0 block's scale: its f16 d widened to float32 (exact, as the int8 copy's scale)."""
    half = builder.load(builder.bitcast(block, ir.HalfType().as_pointer()), align=1)
    return builder.fpext(half, ir.FloatType())


def _q41_halves(builder, block):
    """A Q4_1 block's scale and min widened to float32 (exact), from one 4-byte vector load
    (no move through a general register)."""
    halves = ir.VectorType(ir.HalfType(), 2)
    pair = builder.load(builder.bitcast(block, halves.as_pointer()), align=1)
    wide = builder.fpext(pair, ir.VectorType(ir.FloatType(), 2))
    return [builder.extract_element(wide, ir.Constant(I32, i)) for i in range(2)]


def switch_layouts(builder, tag, group_shift, layouts, emit) -> None:
    """Emit ``emit(layout)`` once per layout of ``layouts`` (GroupCodes) and run the one the
    run-time ``tag`` and ``group_shift`` (int64 values) name: a layout's tag, and the log2 of its
    group (int8 codes come in groups of 16 or 32 under one tag). Any other pair runs the last
    layout. ``emit`` leaves the builder in a block that falls through."""
    key = builder.add(builder.mul(tag, ir.Constant(tag.type, 8)), group_shift)
    done = builder.append_basic_block("layout.done")
    bodies = [builder.append_basic_block(f"layout.{layout.name}") for layout in layouts]
    switch = builder.switch(key, bodies[-1])
    for layout, body in zip(layouts, bodies, strict=True):
        shift = layout.group.bit_length() - 1
        if layout is not layouts[-1]:
            switch.add_case(ir.Constant(key.type, layout.tag * 8 + shift), body)
        builder.position_at_end(body)
        emit(layout)
        builder.branch(done)
    builder.position_at_end(done)


def block_scale(builder, codes: GroupCodes, block):
    """A file block's f16 scale widened to float32 (exact), and its min after it (Q4_1) or
    None. Q4_1's and Q8_0's scale come with the next two bytes in one vector load (no move
    through a general register); Q5_0's alone, as a scalar load."""
    if codes.five_bit:
        return _quint_scale(builder, block), None
    scale, after = _q41_halves(builder, block)
    return scale, after if codes.block_min else None


def prepare_weights(builder, simd: str, codes: GroupCodes, q_ptr):
    """What every row's product with this weight group reuses: (codes, magnitudes or None,
    offset still in the codes), from the group's bytes at ``q_ptr`` in the ``codes`` layout."""
    vnni = simd == "vnni" and codes.group == 32
    # vpdpbusd takes stored unsigned codes as they are and subtracts the offset in its accumulator
    keep_offset = vnni and codes.offset > 0
    if codes.five_bit:
        w = _load_quint(builder, q_ptr, subtract=not keep_offset)
    elif codes.packed:
        w = _load_nibbles(builder, _at(builder, q_ptr, codes.codes_at), 0 if keep_offset else codes.offset)
    else:
        w = _load_codes(builder, _at(builder, q_ptr, codes.codes_at), codes.group)
    if simd == "generic":
        return builder.sext(w, ir.VectorType(I32, codes.group)), None, 0
    if codes.unsigned or keep_offset:
        return w, None, codes.offset if keep_offset else 0  # codes 0..15: their own magnitudes
    sign = "llvm.x86.avx2.psign.b" if codes.group == 32 else "llvm.x86.ssse3.psign.b.128"
    return w, _call(builder, sign, w.type, [w, w]), 0  # (w, |w|)


def _pair_fold(builder, values, n: int):
    """lane k = values[2k] + values[2k + 1] of an int32 vector of n lanes."""
    evens = builder.shuffle_vector(values, values, _constant_vector(list(range(0, n, 2))))
    odds = builder.shuffle_vector(values, values, _constant_vector(list(range(1, n, 2))))
    return builder.add(evens, odds)


def _vpdpbusd(builder, acc, unsigned, signed):
    """acc + per int32 lane j the sum of unsigned[4j + i] * signed[4j + i], i < 4 (exact)."""
    words = ir.VectorType(I32, LANES)
    args = [acc, builder.bitcast(unsigned, words), builder.bitcast(signed, words)]
    return _call(builder, "llvm.x86.avx512.vpdpbusd.256", words, args)


def _vnni_lanes(builder, weights, a):
    """group_lanes for groups of 32 with vpdpbusd."""
    w, w_abs, offset = weights
    zero = ir.Constant(ir.VectorType(I32, LANES), None)
    if w_abs is not None:  # signed codes: |w| times a with w's sign moved onto it
        return _vpdpbusd(builder, zero, w_abs, _call(builder, "llvm.x86.avx2.psign.b", a.type, [a, w]))
    if not offset:
        return _vpdpbusd(builder, zero, w, a)
    # sum (w - offset) a = sum w a - offset * sum a: start from the second term.
    quad_sums = _vpdpbusd(builder, zero, ir.Constant(w.type, [offset] * 32), a)
    return _vpdpbusd(builder, builder.sub(zero, quad_sums), w, a)


def group_lanes(builder, simd: str, group: int, weights, a_ptr):
    """8 int32 lanes of one group's products: for groups of 32, lane j sums products
    4j..4j+3; for groups of 16, products 2j and 2j+1 (ggml's maddubs/madd layout)."""
    a = _load_codes(builder, a_ptr, group)
    w, w_abs, _ = weights
    if simd == "generic":
        pairs = _pair_fold(builder, builder.mul(w, builder.sext(a, ir.VectorType(I32, group))), group)
        return _pair_fold(builder, pairs, 16) if group == 32 else pairs
    if group == 32 and simd == "vnni":
        return _vnni_lanes(builder, weights, a)
    if group == 32:
        if w_abs is None:  # unsigned codes: maddubs takes them as they are (same products)
            pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", ir.VectorType(I16, 16), [w, a])
        else:
            signed = _call(builder, "llvm.x86.avx2.psign.b", a.type, [a, w])
            pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", ir.VectorType(I16, 16), [w_abs, signed])
        ones = ir.Constant(ir.VectorType(I16, 16), [1] * 16)
        return _call(builder, "llvm.x86.avx2.pmadd.wd", ir.VectorType(I32, 8), [pairs, ones])
    signed = _call(builder, "llvm.x86.ssse3.psign.b.128", a.type, [a, w])
    pairs = _call(builder, "llvm.x86.ssse3.pmadd.ub.sw.128", ir.VectorType(I16, 8), [w_abs, signed])
    return builder.sext(pairs, ir.VectorType(I32, 8))


def _fma(builder, a, b, c):
    """a * b + c rounded once, as ggml's ``_mm256_fmadd_ps`` (llvm.fma: the FMA instruction
    where the CPU has one, else libm's exact fmaf)."""
    return _call(builder, f"llvm.fma.v{LANES}f32", a.type, [a, b, c])


def lane_sum(builder, total):
    """The 8 lanes summed as ggml's hsum_float_8: ((x4 + x0) + (x6 + x2)) + ((x5 + x1) + (x7 + x3))."""
    lane = [builder.extract_element(total, ir.Constant(I32, i)) for i in range(LANES)]
    r = [builder.fadd(lane[4 + i], lane[i], flags=EXACT) for i in range(4)]
    return builder.fadd(
        builder.fadd(r[0], r[2], flags=EXACT), builder.fadd(r[1], r[3], flags=EXACT), flags=EXACT
    )


def _min_chains(builder, mins, act_sums, g, chains) -> None:
    """One step of every (weight row, activation row) min-term chain: chain = fma(mins[g],
    group_sums[g], chain), the in-order chain intdot.min_sum computes (``mins``: each weight
    row's mins[g])."""
    for m, row_chains in zip(mins, chains, strict=True):
        for chain, s0 in zip(row_chains, act_sums, strict=True):
            step = _call(
                builder, "llvm.fma.f32", m.type, [m, builder.load(builder.gep(s0, [g])), builder.load(chain)]
            )
            builder.store(step, chain)


def row_dots(builder, simd: str, codes: GroupCodes, weight_rows, act_rows, n_groups, min_terms=None):
    """For every weight row (q pointer, scales pointer) and activation row (codes pointer,
    code scales pointer): sum over groups g of fl(scale[g] * code_scale[g]) * lanes(g),
    accumulated lane-wise with FMA -> [weight row][activation row] float32 values. Each weight
    group is loaded and prepared once for all activation rows; every pair gets the same
    instructions, so the same bits, whichever other rows it is computed with. The weight
    codes are read in the ``codes`` layout (codes.py): packed nibbles or a file's blocks give
    the same integer lanes, so the same bits as their int8 copy, from fewer bytes. A file
    block carries its scale (and min): the scales (and mins) pointers are then unused.

    ``min_terms`` (mins pointer per weight row, group sums pointer per activation row) adds
    each pair's min term, min_sum's chain of fused multiply-adds run in the same group loop
    (its latency hidden behind the vector work) and added to the lane sum as the callers of a
    separate min_sum add it: the same bits."""
    floats = ir.VectorType(ir.FloatType(), LANES)
    accs = [
        [cgutils.alloca_once_value(builder, ir.Constant(floats, None)) for _ in act_rows] for _ in weight_rows
    ]
    zero = ir.Constant(ir.FloatType(), 0.0)
    chains = (
        [[cgutils.alloca_once_value(builder, zero) for _ in act_rows] for _ in weight_rows]
        if min_terms
        else None
    )
    with cgutils.for_range(builder, n_groups) as loop:
        g = loop.index
        offset = builder.mul(g, ir.Constant(g.type, codes.group))
        w_offset = builder.mul(g, ir.Constant(g.type, codes.stride))
        block_mins = []
        for (q0, s0), row_accs in zip(weight_rows, accs, strict=True):
            block = builder.gep(q0, [w_offset])
            weights = prepare_weights(builder, simd, codes, block)
            if codes.block is None:
                scale = builder.load(builder.gep(s0, [g]))
            else:
                scale, low = block_scale(builder, codes, block)
                block_mins.append(low)
            for acc, (a0, d0) in zip(row_accs, act_rows, strict=True):
                factor = builder.fmul(scale, builder.load(builder.gep(d0, [g])), flags=EXACT)
                splat = builder.insert_element(ir.Constant(floats, ir.Undefined), factor, ir.Constant(I32, 0))
                splat = builder.shuffle_vector(splat, splat, _constant_vector([0] * LANES))
                lanes = group_lanes(builder, simd, codes.group, weights, builder.gep(a0, [offset]))
                builder.store(_fma(builder, builder.sitofp(lanes, floats), splat, builder.load(acc)), acc)
        if min_terms:
            weight_mins, act_sums = min_terms
            if not codes.block_min:
                block_mins = [builder.load(builder.gep(m0, [g])) for m0 in weight_mins]
            _min_chains(builder, block_mins, act_sums, g, chains)
    sums = [[lane_sum(builder, builder.load(acc)) for acc in row_accs] for row_accs in accs]
    if not min_terms:
        return sums
    return [
        [
            builder.fadd(total, builder.load(chain), flags=EXACT)
            for total, chain in zip(row, row_chains, strict=True)
        ]
        for row, row_chains in zip(sums, chains, strict=True)
    ]
