"""LLVM operations numba does not offer, as numba intrinsics (they compile into the calling
kernel and, unlike inline assembly or ctypes pointers, keep it cacheable on disk)."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def element_pointer(context, builder, array_type, array, index):
    """An LLVM pointer to array[index] inside an intrinsic's codegen."""
    view = context.make_array(array_type)(context, builder, array)
    return cgutils.get_item_pointer(context, builder, array_type, view, [index])


@intrinsic
def atomic_add(typingctx, counters, index, value):
    """counters[index] += value atomically; returns the value before the add."""
    if not (isinstance(counters, types.Array) and counters.dtype == types.int64):
        return None
    sig = types.int64(counters, index, types.int64)

    def codegen(context, builder, signature, args):
        pointer = element_pointer(context, builder, signature.args[0], args[0], args[1])
        addend = context.cast(builder, args[2], signature.args[2], types.int64)
        return builder.atomic_rmw("add", pointer, addend, "seq_cst")

    return sig, codegen


@intrinsic
def atomic_load(typingctx, counters, index):
    """counters[index], read with acquire ordering (never hoisted out of a wait loop)."""
    if not (isinstance(counters, types.Array) and counters.dtype == types.int64):
        return None
    sig = types.int64(counters, index)

    def codegen(context, builder, signature, args):
        pointer = element_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.load_atomic(pointer, "acquire", 8)

    return sig, codegen


@intrinsic
def cpu_pause(typingctx):
    """The x86 PAUSE hint for spin loops (an LLVM intrinsic: inline asm would not cache)."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause"
        )
        builder.call(fn, [])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def yield_cpu(typingctx):
    """sched_yield(2): let another runnable thread have this core."""
    sig = types.int32()

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield"
        )
        return builder.call(fn, [])

    return sig, codegen


@intrinsic
def prefetch(typingctx, array, index):
    """Hint the CPU to load the cache line holding array[index] (read, keep in all levels)."""
    if not isinstance(array, types.Array):
        return None
    sig = types.void(array, index)

    def codegen(context, builder, signature, args):
        pointer = builder.bitcast(
            element_pointer(context, builder, signature.args[0], args[0], args[1]),
            ir.IntType(8).as_pointer(),
        )
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(fn, [pointer, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


def _integer_arg(context, builder, value, from_type, to_type):
    return context.cast(builder, value, from_type, to_type)


@intrinsic
def float_from_bits(typingctx, bits):
    """The float32 whose bit pattern is ``bits`` (a scalar bitcast; numba has none)."""
    if not isinstance(bits, types.Integer):
        return None
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        word = _integer_arg(context, builder, args[0], signature.args[0], types.uint32)
        return builder.bitcast(word, ir.FloatType())

    return sig, codegen


@intrinsic
def bits_from_float(typingctx, value):
    """The bit pattern (uint32) of a float32."""
    if value != types.float32:
        return None
    sig = types.uint32(value)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def uint16_pointer(typingctx, address):
    """A uint16 pointer at an integer address (for numba.carray over memory a caller keeps
    alive: the KV caches of the rows of one forward live in separate arrays)."""
    if not isinstance(address, types.Integer):
        return None
    sig = types.CPointer(types.uint16)(address)

    def codegen(context, builder, signature, args):
        word = _integer_arg(context, builder, args[0], signature.args[0], types.int64)
        return builder.inttoptr(word, ir.IntType(16).as_pointer())

    return sig, codegen


@intrinsic
def fma32(typingctx, a, b, c):
    """a * b + c in float32 rounded once (llvm.fma: the FMA instruction where the CPU has one,
    else libm's exact fmaf), whatever fastmath setting the caller has."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        values = [context.cast(builder, v, t, types.float32) for v, t in zip(args, (a, b, c), strict=True)]
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32] * 3), "llvm.fma.f32")
        return builder.call(fn, values)

    return sig, codegen


@intrinsic
def half_bits_to_float(typingctx, bits):
    """The float32 value of float16 bits (uint16) through LLVM's half type: one ``vcvtph2ps``
    per 8 values where the CPU has F16C. Only for such CPUs (elsewhere LLVM would call a
    runtime helper numba does not link); fused/kernels.half_value picks."""
    if bits != types.uint16:
        return None
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


def _byte_array(array) -> bool:
    return isinstance(array, types.Array) and array.dtype in (types.int8, types.uint8)


@intrinsic
def load_word(typingctx, array, index):
    """The 8 bytes from byte ``index`` of an int8/uint8 array as one little-endian uint64 (an
    unaligned load): eight codes a step where numba's byte loops do not vectorize."""
    if not _byte_array(array) or not isinstance(index, types.Integer):
        return None
    sig = types.uint64(array, index)

    def codegen(context, builder, signature, args):
        at = _integer_arg(context, builder, args[1], signature.args[1], types.intp)
        pointer = element_pointer(context, builder, signature.args[0], args[0], at)
        return builder.load(builder.bitcast(pointer, ir.IntType(64).as_pointer()), align=1)

    return sig, codegen


@intrinsic
def store_word(typingctx, array, index, value):
    """Write ``value`` (uint64) as 8 little-endian bytes from byte ``index`` of an int8/uint8
    array (an unaligned store)."""
    if not _byte_array(array) or not isinstance(index, types.Integer) or value != types.uint64:
        return None
    sig = types.void(array, index, value)

    def codegen(context, builder, signature, args):
        at = _integer_arg(context, builder, args[1], signature.args[1], types.intp)
        pointer = element_pointer(context, builder, signature.args[0], args[0], at)
        builder.store(args[2], builder.bitcast(pointer, ir.IntType(64).as_pointer()), align=1)
        return context.get_dummy_value()

    return sig, codegen
