"""One attention score as an LLVM vector intrinsic: q (float32) . key row (float16 bits),
summed as tinyBLAS (llama.cpp's f16 GEMM) sums it: an 8-lane FMA accumulator over the head's
8-wide chunks, then hsum8's order. numba does not vectorize that lane-wise FMA chain itself
(41 ns per 64-wide key as scalar code)."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..jit.intrinsics import element_pointer
from ..jit.simd import target_features

HOST_F16C = "f16c" in target_features()
EXACT = ("ninf",)  # see quants/intdot_ir.py: keeps numba's fastmath pass off these operations
F32, I16, I32 = ir.FloatType(), ir.IntType(16), ir.IntType(32)


def _halves_to_floats(builder, halves, f16c: bool):
    """<8 x i16> float16 bits -> <8 x float>, exactly (F16C's conversion, or integer moves and
    one power-of-two multiply that also covers subnormals)."""
    floats = ir.VectorType(F32, 8)
    if f16c:
        return builder.fpext(builder.bitcast(halves, ir.VectorType(ir.HalfType(), 8)), floats)
    wide = builder.zext(halves, ir.VectorType(I32, 8))
    splat = lambda v: ir.Constant(ir.VectorType(I32, 8), [v] * 8)  # noqa: E731
    magnitude = builder.shl(builder.and_(wide, splat(0x7FFF)), splat(13))
    scaled = builder.fmul(
        builder.bitcast(magnitude, floats), ir.Constant(floats, [2.0**112] * 8), flags=EXACT
    )
    sign = builder.shl(builder.and_(wide, splat(0x8000)), splat(16))
    return builder.bitcast(builder.or_(builder.bitcast(scaled, ir.VectorType(I32, 8)), sign), floats)


def _score_intrinsic(f16c: bool):
    @intrinsic
    def score(typingctx, q, keys, t):
        """q (hd,) float32 . keys[t] (ctx, hd) float16 bits, hd a multiple of 8."""
        sig = types.float32(q, keys, t)

        def codegen(context, builder, signature, args):
            q_type, keys_type, t_type = signature.args
            q_arr, keys_arr, t_val = args
            zero = ir.Constant(ir.IntType(64), 0)
            q0 = element_pointer(context, builder, q_type, q_arr, zero)
            view = context.make_array(keys_type)(context, builder, keys_arr)
            row = cgutils.get_item_pointer(
                context, builder, keys_type, view, [context.cast(builder, t_val, t_type, types.int64), zero]
            )
            hd = cgutils.unpack_tuple(builder, context.make_array(q_type)(context, builder, q_arr).shape)[0]
            floats = ir.VectorType(F32, 8)
            acc = cgutils.alloca_once_value(builder, ir.Constant(floats, None))
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(floats, [floats] * 3), "llvm.fma.v8f32"
            )
            with cgutils.for_range(builder, builder.udiv(hd, ir.Constant(hd.type, 8))) as loop:
                offset = builder.mul(loop.index, ir.Constant(loop.index.type, 8))
                qv = builder.load(builder.bitcast(builder.gep(q0, [offset]), floats.as_pointer()), align=4)
                kh = builder.load(
                    builder.bitcast(builder.gep(row, [offset]), ir.VectorType(I16, 8).as_pointer()), align=2
                )
                builder.store(
                    builder.call(fma, [qv, _halves_to_floats(builder, kh, f16c), builder.load(acc)]), acc
                )
            total = builder.load(acc)
            lane = [builder.extract_element(total, ir.Constant(I32, i)) for i in range(8)]
            r = [builder.fadd(lane[4 + i], lane[i], flags=EXACT) for i in range(4)]
            low, high = builder.fadd(r[0], r[2], flags=EXACT), builder.fadd(r[1], r[3], flags=EXACT)
            return builder.fadd(low, high, flags=EXACT)

        return sig, codegen

    return score


score_f16c = _score_intrinsic(True)
score_generic = _score_intrinsic(False)
