"""LLVM IR of the tiled attention's two products (attention_tile.py), with 16 query heads in the
16 lanes of one vector: every lane does exactly the float32 operations the one-row kernels do
for its own query, in the same order, so each lane's result has the one-row kernel's bits.

- ``scores_lanes``: one key against 16 queries. The one-row score (attention_ir.py) keeps an
  8-lane FMA accumulator over the head's 8-wide chunks (lane j sums q[8c+j] * k[8c+j] over c in
  order) and adds the 8 lanes in hsum8's order. Here accumulator j is a 16-query vector, FMA'd
  with the broadcast k[8c+j], and the 8 accumulators are added vector-wise in hsum8's order.
  At 16 lanes three keys share each load of the queries (one key at 8 lanes).
- ``values_lanes``: the weighted values. The one-row kernel sends key t to accumulator lane
  (t mod 8) of every output dimension and FMAs v[t, d] * p[t] there in key order. Here, for
  each lane j and a chunk of 8 dimensions, the 8 accumulators (16 queries each) stay in
  registers while the keys t = j, j + 8, ... of the block stream by.

Operands are float32 (the tile converts its f16 cache rows once per key block) so that each
key element is a broadcast memory operand of the FMA.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..jit.intrinsics import element_pointer
from .attention_ir import _halves_to_floats

WIDTH = 8  # the one-row kernels' accumulator lanes (tinyBLAS's 8-wide vectors)
EXACT = ("ninf",)  # see quants/intdot_ir.py: keeps numba's fastmath pass off these operations
F32, I32, I64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)


def _fma(builder, a, b, c):
    vec = a.type
    name = f"llvm.fma.v{vec.count}f32"
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec] * 3), name)
    return builder.call(fn, [a, b, c])


def contiguous(*arrays) -> bool:
    """Whether every array type is C-contiguous: the kernels step through rows by their length,
    so a strided view (a slice of the last axis) must fail to compile, not read wrong memory."""
    return all(isinstance(a, types.Array) and a.layout == "C" for a in arrays)


def _splat(builder, value, vec):
    """value in every lane of a ``vec``."""
    one = builder.insert_element(ir.Constant(vec, None), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(
        one, ir.Constant(vec, None), ir.Constant(ir.VectorType(I32, vec.count), [0] * vec.count)
    )


def _load_vec(builder, pointer, vec):
    return builder.load(builder.bitcast(pointer, vec.as_pointer()), align=4)


def _store_vec(builder, value, pointer):
    builder.store(value, builder.bitcast(pointer, value.type.as_pointer()), align=4)


def _hsum8(builder, acc):
    """hsum8 of 8 vectors, lane-wise: ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3))."""
    r = [builder.fadd(acc[4 + i], acc[i], flags=EXACT) for i in range(4)]
    return builder.fadd(
        builder.fadd(r[0], r[2], flags=EXACT), builder.fadd(r[1], r[3], flags=EXACT), flags=EXACT
    )


def _as_i64(context, builder, value, value_type):
    return context.cast(builder, value, value_type, types.int64)


def _emit_scores(builder, q_first, key_rows, hd, scale, out_rows):
    """Scores of len(key_rows) keys (pointers to their float32 rows) against the queries at
    q_first (hd, lanes), each stored times ``scale`` (a vector) at its out_rows pointer."""
    vec = scale.type
    zero = ir.Constant(vec, None)
    accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(WIDTH)] for _ in key_rows]
    with cgutils.for_range(builder, builder.udiv(hd, ir.Constant(I64, WIDTH))) as loop:
        d0 = builder.mul(loop.index, ir.Constant(I64, WIDTH))
        for j in range(WIDTH):
            d = builder.add(d0, ir.Constant(I64, j))
            qv = _load_vec(builder, builder.gep(q_first, [builder.mul(d, ir.Constant(I64, vec.count))]), vec)
            for row, acc in zip(key_rows, accs, strict=True):
                kv = _splat(builder, builder.load(builder.gep(row, [d])), vec)
                builder.store(_fma(builder, qv, kv, builder.load(acc[j])), acc[j])
    for acc, out in zip(accs, out_rows, strict=True):
        total = _hsum8(builder, [builder.load(a) for a in acc])
        _store_vec(builder, builder.fmul(total, scale, flags=EXACT), out)


def _scores_intrinsic(lanes: int, keys_per_step: int):
    vec = ir.VectorType(F32, lanes)

    @intrinsic
    def scores_lanes(typingctx, q_lanes, keys, n_keys, scale, out, out_first):
        """out[out_first + b, l] = scale * (query l . keys[b]) for b < n_keys: q_lanes (hd,
        lanes) the queries, keys (>= n_keys, hd) float32 rows, out (rows, lanes) float32; all
        C-contiguous, hd a multiple of 8. ``keys_per_step`` keys share each load of q."""
        if not contiguous(q_lanes, keys, out):
            return None
        sig = types.void(q_lanes, keys, n_keys, scale, out, out_first)

        def codegen(context, builder, signature, args):
            q_t, k_t, n_t, s_t, o_t, f_t = signature.args
            q_arr, k_arr, n_val, s_val, o_arr, f_val = args
            zero = ir.Constant(I64, 0)
            q_first = element_pointer(context, builder, q_t, q_arr, zero)
            k_first = element_pointer(context, builder, k_t, k_arr, zero)
            o_first = element_pointer(context, builder, o_t, o_arr, zero)
            hd = cgutils.unpack_tuple(builder, context.make_array(k_t)(context, builder, k_arr).shape)[1]
            n = _as_i64(context, builder, n_val, n_t)
            first = _as_i64(context, builder, f_val, f_t)
            scale = _splat(builder, context.cast(builder, s_val, s_t, types.float32), vec)

            def emit(b, count):
                bs = [builder.add(b, ir.Constant(I64, i)) for i in range(count)]
                rows = [builder.gep(k_first, [builder.mul(x, hd)]) for x in bs]
                outs = [
                    builder.gep(o_first, [builder.mul(builder.add(first, x), ir.Constant(I64, lanes))])
                    for x in bs
                ]
                _emit_scores(builder, q_first, rows, hd, scale, outs)

            step = ir.Constant(I64, keys_per_step)
            with cgutils.for_range(builder, builder.udiv(n, step)) as loop:
                emit(builder.mul(loop.index, step), keys_per_step)
            done = builder.mul(builder.udiv(n, step), step)
            with cgutils.for_range(builder, builder.sub(n, done)) as loop:
                emit(builder.add(done, loop.index), 1)
            return context.get_dummy_value()

        return sig, codegen

    return scores_lanes


def _emit_values_chunk(builder, accs, p_first, first, v_first, hd, d0, j, n, lanes_first):
    """lanes[j, d0 : d0 + len(accs), :] += the keys b = j, j + 8, ... < n, accumulators in
    registers."""
    vec = accs[0].type.pointee
    width, eight, zero = ir.Constant(I64, vec.count), ir.Constant(I64, WIDTH), ir.Constant(I64, 0)
    base = builder.mul(builder.add(builder.mul(j, hd), d0), width)
    pointers = [
        builder.gep(lanes_first, [builder.add(base, ir.Constant(I64, vec.count * i))])
        for i in range(len(accs))
    ]
    for acc, ptr in zip(accs, pointers, strict=True):
        builder.store(_load_vec(builder, ptr, vec), acc)
    count = builder.udiv(builder.add(builder.sub(n, j), ir.Constant(I64, WIDTH - 1)), eight)
    with cgutils.for_range(builder, builder.select(builder.icmp_unsigned("<", j, n), count, zero)) as key:
        b = builder.add(j, builder.mul(key.index, eight))
        p = _load_vec(builder, builder.gep(p_first, [builder.mul(builder.add(first, b), width)]), vec)
        row = builder.gep(v_first, [builder.add(builder.mul(b, hd), d0)])
        for i, acc in enumerate(accs):
            v = _splat(builder, builder.load(builder.gep(row, [ir.Constant(I64, i)])), vec)
            builder.store(_fma(builder, v, p, builder.load(acc)), acc)
    for acc, ptr in zip(accs, pointers, strict=True):
        _store_vec(builder, builder.load(acc), ptr)


def _values_intrinsic(lanes: int, dims: int):
    vec = ir.VectorType(F32, lanes)

    @intrinsic
    def values_lanes(typingctx, probs, probs_first, values, n_keys, acc_lanes):
        """acc_lanes[(b mod 8), d, l] = fma(values[b, d], probs[probs_first + b, l], ...) for
        keys b < n_keys in order: probs (rows, lanes), values (>= n_keys, hd) float32 rows,
        acc_lanes (8, hd, lanes) float32 accumulators; all C-contiguous, hd a multiple of 8.
        Key b of this call is key (b mod 8) of its lane: callers start every block at a
        multiple of 8 from cache row 0. ``dims`` dimensions at a time (that many accumulators
        in registers), the last 8 alone where hd is not a multiple."""
        if not contiguous(probs, values, acc_lanes):
            return None
        sig = types.void(probs, probs_first, values, n_keys, acc_lanes)

        def codegen(context, builder, signature, args):
            p_t, f_t, v_t, n_t, l_t = signature.args
            p_arr, f_val, v_arr, n_val, l_arr = args
            zero = ir.Constant(I64, 0)
            p_first = element_pointer(context, builder, p_t, p_arr, zero)
            v_first = element_pointer(context, builder, v_t, v_arr, zero)
            l_first = element_pointer(context, builder, l_t, l_arr, zero)
            hd = cgutils.unpack_tuple(builder, context.make_array(v_t)(context, builder, v_arr).shape)[1]
            n = _as_i64(context, builder, n_val, n_t)
            first = _as_i64(context, builder, f_val, f_t)
            accs = [cgutils.alloca_once(builder, vec) for _ in range(dims)]
            wide = ir.Constant(I64, dims)
            with cgutils.for_range(builder, builder.udiv(hd, wide)) as chunk:
                with cgutils.for_range(builder, ir.Constant(I64, WIDTH)) as lane:
                    d0 = builder.mul(chunk.index, wide)
                    _emit_values_chunk(builder, accs, p_first, first, v_first, hd, d0, lane.index, n, l_first)
            odd = builder.icmp_unsigned("!=", builder.urem(hd, wide), zero)
            with builder.if_then(odd):
                with cgutils.for_range(builder, ir.Constant(I64, WIDTH)) as lane:
                    d0 = builder.sub(hd, ir.Constant(I64, WIDTH))
                    _emit_values_chunk(
                        builder, accs[:WIDTH], p_first, first, v_first, hd, d0, lane.index, n, l_first
                    )
            return context.get_dummy_value()

        return sig, codegen

    return values_lanes


# 16 queries per vector where the CPU has AVX-512 (32 vector registers: 3 keys x 8 accumulators,
# 16 value accumulators), 8 elsewhere (16 registers: 1 key, 8 accumulators). The same bits.
# Three keys per load of the queries: 0.86 ns per (query, key) against 1.00 for two (and 0.87
# for four, whose 32 accumulators spill), one thread at 8k keys, an A/B in one process.
scores_lanes16, values_lanes16 = _scores_intrinsic(16, 3), _values_intrinsic(16, 2 * WIDTH)
scores_lanes8, values_lanes8 = _scores_intrinsic(8, 1), _values_intrinsic(8, WIDTH)


def _halves_intrinsic(f16c: bool):
    @intrinsic
    def halves(typingctx, src, t0, n_rows, dst):
        """dst[b, :] = the float32 values of the f16 bits src[t0 + b, :] for b < n_rows: src
        (rows, hd) uint16, dst (>= n_rows, hd) float32, C-contiguous, hd a multiple of 8."""
        if not contiguous(src, dst):
            return None
        sig = types.void(src, t0, n_rows, dst)

        def codegen(context, builder, signature, args):
            s_t, t_t, n_t, d_t = signature.args
            s_arr, t_val, n_val, d_arr = args
            hd = cgutils.unpack_tuple(builder, context.make_array(s_t)(context, builder, s_arr).shape)[1]
            start = builder.mul(_as_i64(context, builder, t_val, t_t), hd)
            src0 = element_pointer(context, builder, s_t, s_arr, ir.Constant(I64, 0))
            dst0 = element_pointer(context, builder, d_t, d_arr, ir.Constant(I64, 0))
            count = builder.mul(_as_i64(context, builder, n_val, n_t), hd)
            eight = ir.Constant(I64, WIDTH)
            with cgutils.for_range(builder, builder.udiv(count, eight)) as loop:
                at = builder.mul(loop.index, eight)
                pointer = builder.gep(src0, [builder.add(start, at)])
                h = builder.load(
                    builder.bitcast(pointer, ir.VectorType(ir.IntType(16), WIDTH).as_pointer()), align=2
                )
                out = builder.bitcast(builder.gep(dst0, [at]), ir.VectorType(F32, WIDTH).as_pointer())
                builder.store(_halves_to_floats(builder, h, f16c), out, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return halves


halves_f16c = _halves_intrinsic(True)
halves_generic = _halves_intrinsic(False)
