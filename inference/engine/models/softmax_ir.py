"""llama.cpp's softmax over the queries of a vector (16 or 8, one per lane), as LLVM IR: each lane does
kernels.softmax_f16_inplace's float operations in its order, so each lane has its bits.

For one lane, with its keys rows first..last of ``scores`` (rows, lanes): the max over those
rows; ggml's expf (ggml_math.expf_ggml) of each score minus the max, 0 outside the lane's rows;
per block of 8 rows the float32 sum in hsum8's order, added to a float64 total; then each
probability times float32(1 / total), rounded to the nearest-even float16 value.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..ggml_math import EXP_LN2_HI, EXP_LN2_LO, EXP_LOG2E, EXP_POLY, EXP_SHIFT
from ..intrinsics import element_pointer
from .attention_tile_ir import EXACT, _fma, _hsum8, _load_vec, _store_vec, contiguous

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


def _max_pass(builder, row, n, first, last):
    lanes = first.type.count
    top = cgutils.alloca_once_value(builder, _f(float("-inf"), lanes))
    with cgutils.for_range(builder, n) as loop:
        s = _load_vec(builder, row(loop.index), _vec(lanes))
        current = builder.load(top)
        take = builder.and_(_inside(builder, loop.index, first, last), builder.fcmp_ordered(">", s, current))
        builder.store(builder.select(take, s, current), top)
    return builder.load(top)


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


def _softmax_intrinsic(lanes: int):
    @intrinsic
    def softmax_lanes(typingctx, scores, first, last):
        """In place over scores (rows, lanes) float32, rows a multiple of 8 and row 0 a multiple
        of 8 from cache row 0: lane l's probabilities over its rows first[l]..last[l] (int64
        (lanes,)), rounded to f16; 0 on every other row."""
        if not contiguous(scores, first, last):
            return None
        sig = types.void(scores, first, last)

        def codegen(context, builder, signature, args):
            s_t, f_t, l_t = signature.args
            s_arr, f_arr, l_arr = args
            zero = ir.Constant(I64, 0)
            s_first = element_pointer(context, builder, s_t, s_arr, zero)
            index_vec = _vec(lanes, I64).as_pointer()
            first_p = builder.bitcast(element_pointer(context, builder, f_t, f_arr, zero), index_vec)
            last_p = builder.bitcast(element_pointer(context, builder, l_t, l_arr, zero), index_vec)
            first_v, last_v = builder.load(first_p, align=8), builder.load(last_p, align=8)
            n = cgutils.unpack_tuple(builder, context.make_array(s_t)(context, builder, s_arr).shape)[0]

            def row(t):
                return builder.gep(s_first, [builder.mul(t, ir.Constant(I64, lanes))])

            top = _max_pass(builder, row, n, first_v, last_v)
            total = _exp_pass(builder, row, n, first_v, last_v, top)
            one = ir.Constant(_vec(lanes, F64), [1.0] * lanes)
            inverse = builder.fptrunc(builder.fdiv(one, total, flags=EXACT), _vec(lanes))
            with cgutils.for_range(builder, n) as loop:
                p = builder.fmul(_load_vec(builder, row(loop.index), _vec(lanes)), inverse, flags=EXACT)
                _store_vec(builder, _round_f16(builder, p), row(loop.index))
            return context.get_dummy_value()

        return sig, codegen

    return softmax_lanes


softmax_lanes16 = _softmax_intrinsic(16)  # AVX-512 hosts
softmax_lanes8 = _softmax_intrinsic(8)  # elsewhere: the same bits
