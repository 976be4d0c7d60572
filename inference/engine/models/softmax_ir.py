"""llama.cpp's softmax over 16 queries at once (one per vector lane), as LLVM IR: each lane does
kernels.softmax_f16_inplace's float operations in its order, so each lane has its bits.

For one lane, with its keys rows first..last of ``scores`` (rows, 16): the max over those
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
from .attention_tile_ir import EXACT, QUERIES, VEC, _hsum8, _load_vec, _store_vec

F32, F64, I32, I64 = ir.FloatType(), ir.DoubleType(), ir.IntType(32), ir.IntType(64)
IVEC, LVEC, DVEC = ir.VectorType(I32, QUERIES), ir.VectorType(I64, QUERIES), ir.VectorType(F64, QUERIES)


def _f(value: float):
    return ir.Constant(VEC, [float(value)] * QUERIES)


def _i(value: int):
    return ir.Constant(IVEC, [value] * QUERIES)


def _call(builder, name, args, result=VEC):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(result, [a.type for a in args]), name)
    return builder.call(fn, args)


def _fma(builder, a, b, c):
    return _call(builder, "llvm.fma.v16f32", [a, b, c])


def _bits(builder, x):
    return builder.bitcast(x, IVEC)


def _floats(builder, x):
    return builder.bitcast(x, VEC)


def _expf(builder, x):
    """ggml's ggml_v_expf lane-wise, the operations of ggml_math.expf_ggml."""
    fsub = lambda a, b: builder.fsub(a, b, flags=EXACT)  # noqa: E731
    fmul = lambda a, b: builder.fmul(a, b, flags=EXACT)  # noqa: E731
    z = _fma(builder, x, _f(EXP_LOG2E), _f(EXP_SHIFT))
    n = fsub(z, _f(EXP_SHIFT))
    minus_n = builder.fneg(n, flags=EXACT)
    b = _fma(builder, minus_n, _f(EXP_LN2_LO), _fma(builder, minus_n, _f(EXP_LN2_HI), x))
    e = builder.shl(_bits(builder, z), _i(23))
    k = _floats(builder, builder.add(e, _i(0x3F800000)))
    u = fmul(b, b)
    c0, c1, c2, c3, c4 = (_f(c) for c in EXP_POLY)
    j = _fma(builder, _fma(builder, _fma(builder, c0, b, c1), u, _fma(builder, c2, b, c3)), u, fmul(c4, b))
    g = builder.select(builder.fcmp_ordered("<=", n, _f(0.0)), _i(0x82000000 - (1 << 32)), _i(0))
    s1 = _floats(builder, builder.add(g, _i(0x7F000000)))
    s2 = _floats(builder, builder.sub(e, g))
    magnitude = _call(builder, "llvm.fabs.v16f32", [n])
    scaled = builder.select(
        builder.fcmp_ordered("<=", magnitude, _f(192.0)), fmul(_fma(builder, s2, j, s2), s1), fmul(s1, s1)
    )
    return builder.select(builder.fcmp_ordered("<=", magnitude, _f(126.0)), _fma(builder, j, k, k), scaled)


def _round_f16(builder, x):
    """Nearest-even float16 values, as kernels.round_f16_inplace rounds."""
    b = _bits(builder, x)
    odd = builder.and_(builder.lshr(b, _i(13)), _i(1))
    normal = _floats(
        builder, builder.and_(builder.add(builder.add(b, _i(0xFFF)), odd), _i(0xFFFFE000 - (1 << 32)))
    )
    # x / 2**-24 as the scalar code writes it, as a multiply: the same exact result, no divide
    steps = _call(builder, "llvm.rint.v16f32", [builder.fmul(x, _f(2.0**24), flags=EXACT)])
    sub = builder.fmul(steps, _f(2.0**-24), flags=EXACT)
    small = builder.fcmp_ordered("<", _call(builder, "llvm.fabs.v16f32", [x]), _f(2.0**-14))
    return builder.select(small, sub, normal)


def _inside(builder, t, first, last):
    """Lanes whose rows first..last hold row t."""
    ts = builder.insert_element(ir.Constant(LVEC, None), t, ir.Constant(I32, 0))
    ts = builder.shuffle_vector(ts, ir.Constant(LVEC, None), ir.Constant(IVEC, [0] * QUERIES))
    return builder.and_(builder.icmp_signed("<=", first, ts), builder.icmp_signed("<=", ts, last))


def _max_pass(builder, row, n, first, last):
    top = cgutils.alloca_once_value(builder, _f(float("-inf")))
    with cgutils.for_range(builder, n) as loop:
        s = _load_vec(builder, row(loop.index))
        current = builder.load(top)
        take = builder.and_(_inside(builder, loop.index, first, last), builder.fcmp_ordered(">", s, current))
        builder.store(builder.select(take, s, current), top)
    return builder.load(top)


def _exp_pass(builder, row, n, first, last, top):
    """Scores become exp(score - top) or 0; returns the float64 total of the 8-row block sums."""
    total = cgutils.alloca_once_value(builder, ir.Constant(DVEC, [0.0] * QUERIES))
    with cgutils.for_range(builder, builder.udiv(n, ir.Constant(I64, 8))) as loop:
        t0 = builder.mul(loop.index, ir.Constant(I64, 8))
        block = []
        for r in range(8):
            t = builder.add(t0, ir.Constant(I64, r))
            e = _expf(builder, builder.fsub(_load_vec(builder, row(t)), top, flags=EXACT))
            e = builder.select(_inside(builder, t, first, last), e, _f(0.0))
            _store_vec(builder, e, row(t))
            block.append(e)
        s = builder.fpext(_hsum8(builder, block), DVEC)
        builder.store(builder.fadd(builder.load(total), s, flags=EXACT), total)
    return builder.load(total)


@intrinsic
def softmax_lanes(typingctx, scores, first, last):
    """In place over scores (rows, 16) float32, rows a multiple of 8 and row 0 a multiple of 8
    from cache row 0: lane l's probabilities over its rows first[l]..last[l] (int64 (16,)),
    rounded to f16; 0 on every other row."""
    sig = types.void(scores, first, last)

    def codegen(context, builder, signature, args):
        s_t, f_t, l_t = signature.args
        s_arr, f_arr, l_arr = args
        zero = ir.Constant(I64, 0)
        s_first = element_pointer(context, builder, s_t, s_arr, zero)
        first_v = builder.load(
            builder.bitcast(element_pointer(context, builder, f_t, f_arr, zero), LVEC.as_pointer()), align=8
        )
        last_v = builder.load(
            builder.bitcast(element_pointer(context, builder, l_t, l_arr, zero), LVEC.as_pointer()), align=8
        )
        n = cgutils.unpack_tuple(builder, context.make_array(s_t)(context, builder, s_arr).shape)[0]

        def row(t):
            return builder.gep(s_first, [builder.mul(t, ir.Constant(I64, QUERIES))])

        top = _max_pass(builder, row, n, first_v, last_v)
        total = _exp_pass(builder, row, n, first_v, last_v, top)
        one = ir.Constant(DVEC, [1.0] * QUERIES)
        inverse = builder.fptrunc(builder.fdiv(one, total, flags=EXACT), VEC)
        with cgutils.for_range(builder, n) as loop:
            p = builder.fmul(_load_vec(builder, row(loop.index)), inverse, flags=EXACT)
            _store_vec(builder, _round_f16(builder, p), row(loop.index))
        return context.get_dummy_value()

    return sig, codegen
