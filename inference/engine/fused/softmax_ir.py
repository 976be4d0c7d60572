"""llama.cpp's softmax over the queries of a vector (16 or 8, one per lane), as LLVM IR: each lane does
kernels.softmax_f16_inplace's float operations in its order, so each lane has its bits.

For one lane, with its keys rows first..last of ``scores`` (rows, lanes): the max over those
rows; ggml's expf (ggml_math.expf_ggml) of each score minus the max, 0 outside the lane's rows;
per block of 8 rows the float32 sum in hsum8's order, added to a float64 total; then each
probability times float32(1 / total), rounded to the nearest-even float16 value. Three
intrinsics, so that the tile can run the max and the last step block by block:
``max_lanes`` (rows r0..r1 into a running max), ``exp_lanes`` (all rows; the inverse total) and
``scale_lanes`` (rows r0..r1 to probabilities).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..jit.intrinsics import element_pointer
from .attention_tile_ir import EXACT, _fma, _hsum8, _load_vec, _store_vec, contiguous
from .ggml_math import EXP_LN2_HI, EXP_LN2_LO, EXP_LOG2E, EXP_POLY, EXP_SHIFT

F32, F64, I32, I64 = ir.FloatType(), ir.DoubleType(), ir.IntType(32), ir.IntType(64)


def _vec(lanes: int, element=F32):
    return ir.VectorType(element, lanes)


def _f(value: float, lanes: int):
    return ir.Constant(_vec(lanes), [float(value)] * lanes)


def _i(value: int, lanes: int):
    return ir.Constant(_vec(lanes, I32), [value] * lanes)


def _call(builder, name, args):
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(args[0].type, [a.type for a in args]), name
    )
    return builder.call(fn, args)


def _expf(builder, x):
    """ggml's ggml_v_expf lane-wise, the operations of ggml_math.expf_ggml."""
    lanes = x.type.count
    f = lambda v: _f(v, lanes)  # noqa: E731
    i = lambda v: _i(v, lanes)  # noqa: E731
    bits = lambda v: builder.bitcast(v, _vec(lanes, I32))  # noqa: E731
    floats = lambda v: builder.bitcast(v, _vec(lanes))  # noqa: E731
    fmul = lambda a, b: builder.fmul(a, b, flags=EXACT)  # noqa: E731
    z = _fma(builder, x, f(EXP_LOG2E), f(EXP_SHIFT))
    n = builder.fsub(z, f(EXP_SHIFT), flags=EXACT)
    minus_n = builder.fneg(n, flags=EXACT)
    b = _fma(builder, minus_n, f(EXP_LN2_LO), _fma(builder, minus_n, f(EXP_LN2_HI), x))
    e = builder.shl(bits(z), i(23))
    k = floats(builder.add(e, i(0x3F800000)))
    u = fmul(b, b)
    c0, c1, c2, c3, c4 = (f(c) for c in EXP_POLY)
    j = _fma(builder, _fma(builder, _fma(builder, c0, b, c1), u, _fma(builder, c2, b, c3)), u, fmul(c4, b))
    g = builder.select(builder.fcmp_ordered("<=", n, f(0.0)), i(0x82000000 - (1 << 32)), i(0))
    s1, s2 = floats(builder.add(g, i(0x7F000000))), floats(builder.sub(e, g))
    magnitude = _call(builder, f"llvm.fabs.v{lanes}f32", [n])
    scaled = builder.select(
        builder.fcmp_ordered("<=", magnitude, f(192.0)), fmul(_fma(builder, s2, j, s2), s1), fmul(s1, s1)
    )
    return builder.select(builder.fcmp_ordered("<=", magnitude, f(126.0)), _fma(builder, j, k, k), scaled)


def _round_f16(builder, x):
    """Nearest-even float16 values, as kernels.round_f16_inplace rounds."""
    lanes = x.type.count
    b = builder.bitcast(x, _vec(lanes, I32))
    odd = builder.and_(builder.lshr(b, _i(13, lanes)), _i(1, lanes))
    rounded = builder.and_(
        builder.add(builder.add(b, _i(0xFFF, lanes)), odd), _i(0xFFFFE000 - (1 << 32), lanes)
    )
    normal = builder.bitcast(rounded, _vec(lanes))
    # x / 2**-24 as the scalar code writes it, as a multiply: the same exact result, no divide
    steps = _call(builder, f"llvm.rint.v{lanes}f32", [builder.fmul(x, _f(2.0**24, lanes), flags=EXACT)])
    sub = builder.fmul(steps, _f(2.0**-24, lanes), flags=EXACT)
    small = builder.fcmp_ordered("<", _call(builder, f"llvm.fabs.v{lanes}f32", [x]), _f(2.0**-14, lanes))
    return builder.select(small, sub, normal)


def _inside(builder, t, first, last):
    """Lanes whose rows first..last hold row t."""
    lanes = first.type.count
    ts = builder.insert_element(ir.Constant(first.type, None), t, ir.Constant(I32, 0))
    ts = builder.shuffle_vector(ts, ir.Constant(first.type, None), ir.Constant(_vec(lanes, I32), [0] * lanes))
    return builder.and_(builder.icmp_signed("<=", first, ts), builder.icmp_signed("<=", ts, last))


def _loop_rows(builder, r0, r1):
    """A loop over rows r0..r1 (i64); yields the row index inside the loop."""
    return cgutils.for_range(builder, builder.sub(r1, r0))


def _max_pass(builder, row, r0, r1, first, last, top_p, masked):
    """top_p (a float32 pointer, unaligned) := the max of its lanes and each lane's own scores of
    rows r0..r1, in row order (the one-row kernel's comparisons, in its order). Unless
    ``masked``, every row is inside every lane's range (the caller checked)."""
    top = cgutils.alloca_once_value(builder, _load_vec(builder, top_p, _vec(first.type.count)))
    with _loop_rows(builder, r0, r1) as loop:
        t = builder.add(r0, loop.index)
        s = _load_vec(builder, row(t), _vec(first.type.count))
        current = builder.load(top)
        take = builder.fcmp_ordered(">", s, current)
        if masked:
            take = builder.and_(_inside(builder, t, first, last), take)
        builder.store(builder.select(take, s, current), top)
    _store_vec(builder, builder.load(top), top_p)


def _exp_pass(builder, row, n, first, last, top):
    """Scores become exp(score - top) or 0; returns the float64 total of the 8-row block sums."""
    lanes = first.type.count
    total = cgutils.alloca_once_value(builder, ir.Constant(_vec(lanes, F64), [0.0] * lanes))
    with cgutils.for_range(builder, builder.udiv(n, ir.Constant(I64, 8))) as loop:
        t0 = builder.mul(loop.index, ir.Constant(I64, 8))
        block = []
        for r in range(8):
            t = builder.add(t0, ir.Constant(I64, r))
            e = _expf(builder, builder.fsub(_load_vec(builder, row(t), _vec(lanes)), top, flags=EXACT))
            e = builder.select(_inside(builder, t, first, last), e, _f(0.0, lanes))
            _store_vec(builder, e, row(t))
            block.append(e)
        s = builder.fpext(_hsum8(builder, block), _vec(lanes, F64))
        builder.store(builder.fadd(builder.load(total), s, flags=EXACT), total)
    return builder.load(total)


class _Lanes:
    """The arrays an intrinsic of this file takes, as LLVM values: scores (rows, lanes) float32,
    and (lanes,) vectors (first/last int64 row ranges, top/inverse float32)."""

    def __init__(self, context, builder, signature, args):
        self.context, self.builder = context, builder
        self.types, self.args = signature.args, args

    def first(self, i):
        """A pointer to the first element of argument i."""
        return element_pointer(self.context, self.builder, self.types[i], self.args[i], ir.Constant(I64, 0))

    def pointer(self, i, element):
        return self.builder.bitcast(self.first(i), element.as_pointer())

    def vector(self, i, element):
        return self.builder.load(self.pointer(i, element), align=8)

    def index(self, i):
        return self.context.cast(self.builder, self.args[i], self.types[i], types.int64)

    def row_of(self, lanes):
        s_first = self.first(0)
        return lambda t: self.builder.gep(s_first, [self.builder.mul(t, ir.Constant(I64, lanes))])

    def n_rows(self):
        view = self.context.make_array(self.types[0])(self.context, self.builder, self.args[0])
        return cgutils.unpack_tuple(self.builder, view.shape)[0]


def _max_intrinsic(lanes: int, masked: bool):
    @intrinsic
    def max_lanes(typingctx, scores, r0, r1, first, last, top):
        """top[l] := max(top[l], the scores of rows r0..r1 inside lane l's rows first[l]..last[l]):
        scores (rows, lanes) float32, first/last (lanes,) int64, top (lanes,) float32. The
        unmasked variant is for rows inside every lane's range (the same result, 0.14 ns per
        (query, key) less: the range test cost as much as the rest of the pass)."""
        if not contiguous(scores, first, last, top):
            return None

        def codegen(context, builder, signature, args):
            a = _Lanes(context, builder, signature, args)
            top_p = a.pointer(5, F32)
            first_v, last_v = a.vector(3, _vec(lanes, I64)), a.vector(4, _vec(lanes, I64))
            _max_pass(builder, a.row_of(lanes), a.index(1), a.index(2), first_v, last_v, top_p, masked)
            return context.get_dummy_value()

        return types.void(scores, r0, r1, first, last, top), codegen

    return max_lanes


def _exp_intrinsic(lanes: int):
    @intrinsic
    def exp_lanes(typingctx, scores, first, last, top, inverse):
        """In place over scores (rows, lanes) float32, rows a multiple of 8 and row 0 a multiple
        of 8 from cache row 0: exp(score - top[l]) on lane l's rows first[l]..last[l], 0 on
        every other row; inverse[l] := float32(1 / the float64 total of the 8-row block sums)."""
        if not contiguous(scores, first, last, top, inverse):
            return None

        def codegen(context, builder, signature, args):
            a = _Lanes(context, builder, signature, args)
            first_v, last_v = a.vector(1, _vec(lanes, I64)), a.vector(2, _vec(lanes, I64))
            top = _load_vec(builder, a.pointer(3, F32), _vec(lanes))
            total = _exp_pass(builder, a.row_of(lanes), a.n_rows(), first_v, last_v, top)
            one = ir.Constant(_vec(lanes, F64), [1.0] * lanes)
            inverse_v = builder.fptrunc(builder.fdiv(one, total, flags=EXACT), _vec(lanes))
            _store_vec(builder, inverse_v, a.pointer(4, F32))
            return context.get_dummy_value()

        return types.void(scores, first, last, top, inverse), codegen

    return exp_lanes


def _scale_intrinsic(lanes: int):
    @intrinsic
    def scale_lanes(typingctx, scores, r0, r1, inverse, probs):
        """probs[t - r0] := scores[t] (exponentials) times inverse (lanes,), rounded to f16
        values, for rows r0..r1: scores and probs (rows, lanes) float32 (probs may be scores
        itself with r0 = 0)."""
        if not contiguous(scores, inverse, probs):
            return None

        def codegen(context, builder, signature, args):
            a = _Lanes(context, builder, signature, args)
            inverse_v = _load_vec(builder, a.pointer(3, F32), _vec(lanes))
            row, r0_v = a.row_of(lanes), a.index(1)
            p_first = a.pointer(4, F32)
            with _loop_rows(builder, r0_v, a.index(2)) as loop:
                e = _load_vec(builder, row(builder.add(r0_v, loop.index)), _vec(lanes))
                p = builder.fmul(e, inverse_v, flags=EXACT)
                at = builder.gep(p_first, [builder.mul(loop.index, ir.Constant(I64, lanes))])
                _store_vec(builder, _round_f16(builder, p), at)
            return context.get_dummy_value()

        return types.void(scores, r0, r1, inverse, probs), codegen

    return scale_lanes


# The softmax in three steps so that the tile runs the first (max) and the last (scale) block by
# block inside its products, while a block's scores are in L1: at 27k keys a tile's scores
# (vecs, keys, lanes) are 7 MB, beyond L2, and each separate pass over them went to L3 or memory
# (the scale step writes a block's probabilities to a small buffer, not back over the scores).
# 16 lanes on AVX-512 hosts, 8 elsewhere: the same bits.
max_lanes16, max_all16 = _max_intrinsic(16, True), _max_intrinsic(16, False)
max_lanes8, max_all8 = _max_intrinsic(8, True), _max_intrinsic(8, False)
exp_lanes16, scale_lanes16 = _exp_intrinsic(16), _scale_intrinsic(16)
exp_lanes8, scale_lanes8 = _exp_intrinsic(8), _scale_intrinsic(8)
