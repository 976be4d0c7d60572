"""The FFN's activation of a tile of gate and up values (step_products.ffn_stage), in loops LLVM
vectorizes: out = SiLU(gate) * up or GELU(gate) * up, each value bit for bit the scalar
form's (rowops.silu_one, rowops.gelu_lookup).

The scalar forms branch per value (silu_one between ggml's vector expf and libm's, gelu_lookup
on its range and f16_bits on subnormals) and numba's float division checks for zero, so their
loops ran one value at a time: ~10% of a 16-token prefill's CPU time on Qwen2.5, ~6% on Gemma 3.
Here both sides of each branch are computed and one selected, and the division is IEEE's
(``error_model="numpy"``, no check).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..jit.intrinsics import element_pointer
from .ggml_math import expf_ggml
from .kernels import F16_MIN_NORMAL, F16_SUBNORMAL_STEP
from .rowops import silu_one


@numba.njit(cache=True, error_model="numpy")
def silu_mul(gate, up, out, vector_end):
    """out[i] = SiLU(gate[i]) * up[i] for i < out.shape[0]; the first ``vector_end`` as ggml's
    8-wide blocks compute them (silu_one's vector lanes), the rest with libm's expf."""
    for i in range(vector_end):
        g = gate[i]
        out[i] = g / (np.float32(1.0) + expf_ggml(np.float32(0.0) - g)) * up[i]
    for i in range(vector_end, out.shape[0]):
        out[i] = silu_one(gate[i], False) * up[i]


@numba.njit(cache=True, inline="always")
def _f16_index(v, b):
    """kernels.f16_bits(v, b) as a table index, without a branch: both roundings computed
    (the subnormal one of min(|v|, F16_MIN_NORMAL), always in range), one selected. Any v
    (NaN, |v| >= 65504 too) gives an index below 65536, the one f16_bits gives where it applies."""
    sign = (b >> np.uint32(16)) & np.uint32(0x8000)
    magnitude = abs(v)
    small = np.uint32(np.rint(min(magnitude, F16_MIN_NORMAL) / F16_SUBNORMAL_STEP))
    r = (b & np.uint32(0x7FFFFFFF)) + np.uint32(0xFFF) + ((b >> np.uint32(13)) & np.uint32(1))
    exponent = (r >> np.uint32(23)) - np.uint32(112)  # rebias 127 -> 15
    normal = (exponent << np.uint32(10)) | ((r >> np.uint32(13)) & np.uint32(0x3FF))
    return (sign | (small if magnitude < F16_MIN_NORMAL else normal)) & np.uint32(0xFFFF)


GATHER = 16  # table entries one gather instruction reads


@intrinsic
def _gather16(typingctx, table, slots, at):
    """slots[at : at + 16] (float32 holding uint32 table indices) := table[those indices], one
    vector gather (LLVM does not vectorize a table lookup into one for AMD's cores itself)."""
    if not (isinstance(table, types.Array) and isinstance(slots, types.Array)):
        return None
    sig = types.void(table, slots, at)

    def codegen(context, builder, signature, args):
        f32, i32 = ir.FloatType(), ir.IntType(32)
        first = element_pointer(context, builder, signature.args[1], args[1], args[2])
        words = builder.load(builder.bitcast(first, ir.VectorType(i32, GATHER).as_pointer()), align=4)
        base = element_pointer(context, builder, signature.args[0], args[0], ir.Constant(ir.IntType(64), 0))
        i64s = ir.VectorType(ir.IntType(64), GATHER)
        offsets = builder.shl(builder.zext(words, i64s), ir.Constant(i64s, [2] * GATHER))  # 4 bytes an entry
        start = builder.ptrtoint(base, ir.IntType(64))
        starts = builder.insert_element(ir.Constant(i64s, None), start, ir.Constant(i32, 0))
        starts = builder.shuffle_vector(starts, starts, ir.Constant(ir.VectorType(i32, GATHER), [0] * GATHER))
        pointers = builder.inttoptr(builder.add(starts, offsets), ir.VectorType(f32.as_pointer(), GATHER))
        name = f"llvm.masked.gather.v{GATHER}f32.v{GATHER}p0f32"
        fnty = ir.FunctionType(
            ir.VectorType(f32, GATHER),
            [pointers.type, i32, ir.VectorType(ir.IntType(1), GATHER), ir.VectorType(f32, GATHER)],
        )
        fn = cgutils.get_or_insert_function(builder.module, fnty, name)
        everything = ir.Constant(ir.VectorType(ir.IntType(1), GATHER), [1] * GATHER)
        passthru = ir.Constant(fnty.args[3], None)
        looked = builder.call(fn, [pointers, ir.Constant(i32, 4), everything, passthru])
        builder.store(looked, builder.bitcast(first, looked.type.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, error_model="numpy")
def gelu_mul(gate, up, out, table):
    """out[i] = gelu_lookup(gate[i]) * up[i] for i < out.shape[0] (table: rowops.gelu_table):
    the table indices computed into ``out`` (a vectorized loop), looked up 16 at a time by a
    gather, then the range's edges selected and ``up`` multiplied (vectorized again)."""
    n, bits, slots = out.shape[0], gate.view(np.uint32), out.view(np.uint32)
    for i in range(n):
        slots[i] = _f16_index(gate[i], bits[i])
    whole = n - n % GATHER
    for at in range(0, whole, GATHER):
        _gather16(table, out, at)
    for i in range(whole, n):
        out[i] = table[slots[i]]
    for i in range(n):
        v = gate[i]
        value = np.float32(0.0) if v <= np.float32(-10.0) else (v if v >= np.float32(10.0) else out[i])
        out[i] = value * up[i]
