"""The parallel region of the fused forward (step_kernels.py): every thread walks every stage.

``forward_rows`` starts one region of n_threads threads over scratch new_scratch allocated;
each runs ``run_stages`` over the same stage list, sharing the work through counters. The
region calls run_stages, and run_stages the stages, through function pointers
(stage_calls.py): each is compiled once, as a kernel of its own, and a cold start compiles
part of them in a second process (compile_split.py). stage_calls.prepare(forward_rows, args)
makes their addresses ready before the first call (fused.FusedForward does).
"""

from __future__ import annotations

from collections import namedtuple

import numba
import numpy as np

from ..jit.borrow import borrowed
from ..jit.kernel_only import kernel_only
from ..jit.stage_calls import Sites, compile_elsewhere, start_early
from ..quants.intdot import ROW_BLOCK
from .attention_tile import attend_scratch_size, attend_tile
from .kernels import attend_head
from .prefill_tiles import dot_tile_narrow
from .step_attention import ATTEND_SITES, attend_stage
from .step_kernels import (
    ADD,
    ATTEND,
    COLS,
    DOWN,
    FFN,
    FFN_POST,
    FLAGS,
    GELU,
    HEAD_DIM,
    KV,
    N_FF,
    N_HEADS,
    N_KV,
    OUT,
    OUT_POST,
    POST_NORMS,
    PREP_DOWN,
    PREP_FFN,
    PREP_OUT,
    PREP_QKV,
    QKV,
    ROUND_SITES,
    SLOT_DOWN,
    SLOT_GATE,
    SLOT_OUT,
    SLOT_Q,
    SOLO_ROWS,
    STAGES_PER_LAYER,
    STORE,
    Rounded,
    StepModel,
    StepRows,
    StepWeights,
    add_normed_stage,
    kv_stage,
    prepare_stage,
)
from .step_products import KERNEL_SITES, ffn_stage, rows_stage

Scratch = namedtuple(
    "Scratch",
    [
        "qkv",
        "attn",
        "act",
        "proj",
        "normed",
        "values",
        "ints",
        "int_scales",
        "sums",
        "q_buf",
        "scores",
        "all_rows",
    ],
)


# The stages are called through pointers (stage_calls.py): numba compiles each once, and the
# region above them compiles without re-optimizing them. Site X_AT calls the function added
# as X_AT below; CALLS_THROUGH: the stages that make pointer calls themselves.
STAGES = Sites("step_region")
CALLS_THROUGH = {
    rows_stage: KERNEL_SITES,
    ffn_stage: KERNEL_SITES,
    attend_stage: ATTEND_SITES,
    prepare_stage: ROUND_SITES,
}


def _site(stage_function) -> int:
    return STAGES.add(stage_function, CALLS_THROUGH.get(stage_function))


PREP_QKV_AT = _site(prepare_stage)
QKV_AT = _site(rows_stage)
KV_AT = _site(kv_stage)
ATTEND_AT = _site(attend_stage)
PREP_OUT_AT = _site(prepare_stage)
OUT_STORE_AT = _site(rows_stage)
OUT_POST_AT = _site(add_normed_stage)
OUT_ADD_AT = _site(rows_stage)
PREP_FFN_AT = _site(prepare_stage)
FFN_AT = _site(ffn_stage)
PREP_DOWN_AT = _site(prepare_stage)
DOWN_STORE_AT = _site(rows_stage)
FFN_POST_AT = _site(add_normed_stage)
DOWN_ADD_AT = _site(rows_stage)
PREP_HEAD_AT = _site(prepare_stage)
HEAD_AT = _site(rows_stage)
stage = STAGES.call


# Inlined into run_stages by numba (not a function of its own): one level fewer for LLVM to
# re-optimize on a cold start.
@numba.njit(cache=True, inline="always")
def _layer(tid, layer, x, model, rows, scratch, rounded, counters, solo):
    w, dims, eps, lin = model.weights, model.dims, model.eps, model.linears[layer]
    at, n_rows, n_layers = layer * STAGES_PER_LAYER, x.shape[0], model.linears.shape[0]
    window, rope = model.layer_info[layer, 0], model.layer_info[layer, 1]
    normed, no_norm, post = scratch.normed[tid], model.output_norm[:0], dims[FLAGS] & POST_NORMS
    qkv_lin, out_lin = lin[SLOT_Q:SLOT_OUT], lin[SLOT_OUT:SLOT_GATE]
    ffn_lin, down_lin = lin[SLOT_GATE:SLOT_DOWN], lin[SLOT_DOWN:]
    all_rows, norms, qk_norms = scratch.all_rows, model.norms[layer], model.qk_norms[layer]
    stage(
        PREP_QKV_AT,
        (
            x,
            all_rows,
            norms[0],
            eps,
            qkv_lin,
            rounded,
            normed,
            solo,
            counters,
            at + PREP_QKV,
        ),
    )
    stage(QKV_AT, (w, qkv_lin, rounded, n_rows, scratch.qkv, STORE, counters, at + QKV, tid))
    stage(
        KV_AT,
        (
            scratch.qkv,
            qk_norms[1],
            eps,
            rows,
            rope,
            dims,
            layer,
            n_layers,
            counters,
            at + KV,
        ),
    )
    stage(
        ATTEND_AT,
        (
            scratch.qkv,
            qk_norms[0],
            eps,
            rows,
            rope,
            dims,
            layer,
            n_layers,
            window,
            model.scale,
            scratch.q_buf[tid],
            scratch.scores[tid],
            scratch.attn,
            counters,
            at + ATTEND,
        ),
    )
    stage(
        PREP_OUT_AT,
        (
            scratch.attn,
            all_rows,
            no_norm,
            eps,
            out_lin,
            rounded,
            normed,
            solo,
            counters,
            at + PREP_OUT,
        ),
    )
    if post:
        stage(OUT_STORE_AT, (w, out_lin, rounded, n_rows, scratch.proj, STORE, counters, at + OUT, tid))
        stage(OUT_POST_AT, (x, scratch.proj, norms[1], eps, counters, at + OUT_POST))
    else:
        stage(OUT_ADD_AT, (w, out_lin, rounded, n_rows, x, ADD, counters, at + OUT, tid))
    stage(
        PREP_FFN_AT,
        (
            x,
            all_rows,
            norms[2],
            eps,
            ffn_lin,
            rounded,
            normed,
            solo,
            counters,
            at + PREP_FFN,
        ),
    )
    stage(
        FFN_AT,
        (
            w,
            ffn_lin,
            rounded,
            dims[N_FF],
            dims[FLAGS] & GELU,
            scratch.act,
            counters,
            at + FFN,
            tid,
        ),
    )
    stage(
        PREP_DOWN_AT,
        (
            scratch.act,
            all_rows,
            no_norm,
            eps,
            down_lin,
            rounded,
            normed,
            solo,
            counters,
            at + PREP_DOWN,
        ),
    )
    if post:
        stage(DOWN_STORE_AT, (w, down_lin, rounded, n_rows, scratch.proj, STORE, counters, at + DOWN, tid))
        stage(FFN_POST_AT, (x, scratch.proj, norms[3], eps, counters, at + FFN_POST))
    else:
        stage(DOWN_ADD_AT, (w, down_lin, rounded, n_rows, x, ADD, counters, at + DOWN, tid))


@kernel_only()
def run_stages(tid, x, model, rows, scratch, logits, counters, solo):
    """Every stage of one forward, as thread ``tid`` of the region sees it."""
    copy = np.int64(tid) if solo else np.int64(0)
    rounded = Rounded(scratch.values[copy], scratch.ints[copy], scratch.int_scales[copy], scratch.sums[copy])
    n_layers = model.linears.shape[0]
    for layer in range(n_layers):
        _layer(tid, layer, x, model, rows, scratch, rounded, counters, solo)
    head_rows = rows.head_rows
    if head_rows.shape[0] > 0:
        at = n_layers * STAGES_PER_LAYER
        normed, n_head = scratch.normed[tid], head_rows.shape[0]
        stage(
            PREP_HEAD_AT,
            (x, head_rows, model.output_norm, model.eps, model.head, rounded, normed, solo, counters, at),
        )
        stage(HEAD_AT, (model.weights, model.head, rounded, n_head, logits, STORE, counters, at + 1, tid))


# The region's body is one pointer call of run_stages: the parallel loop's lowering (numba
# compiles its body as a gufunc, then a wrapper) stays small, and run_stages, compiled once
# as a kernel of its own, can go to the second process of a cold start.
RUN_AT = STAGES.add(run_stages, STAGES)


# Only the prange loop runs in parallel: numba's other parallel rewrites would start a region
# for each array expression. (np.zeros and .max() became parallel loops even so: new_scratch
# allocates in Python.)
PRANGE_ONLY = {
    "comprehension": False,
    "reduction": False,
    "numpy": False,
    "stencil": False,
    "fusion": False,
    "setitem": False,
    "inplace_binop": False,
}


def new_scratch(
    n_threads: int, x: np.ndarray, model: StepModel, rows: StepRows
) -> tuple[Scratch, np.ndarray]:
    """The scratch of one forward of the rows x, and its stage counters (claimed | done).
    Allocated by numpy here, not in forward_rows: compiled, the allocations cost a cold start
    ~2 s (numba turned np.zeros into parallel loops of their own in forward_rows, and
    compiled each np.empty/np.zeros shape), and here they take microseconds."""
    dims, n_rows, n_embd = model.dims, x.shape[0], x.shape[1]
    n_heads, n_kv, hd, n_ff = (int(dims[i]) for i in (N_HEADS, N_KV, HEAD_DIM, N_FF))
    max_cols = int(max(model.linears[:, :, COLS].max(), model.head[0, COLS]))
    n_stages = (model.linears.shape[0] + 1) * STAGES_PER_LAYER
    copies = n_threads if n_rows <= SOLO_ROWS else 1
    padded = -(-n_rows // ROW_BLOCK) * ROW_BLOCK  # rounded inputs: whole blocks of rows, zero padding
    attend_floats = attend_scratch_size(int(rows.positions.max()) + 1, hd, hd, n_heads // n_kv)
    rounded_shape = (copies, 3, padded, max_cols)  # (copies, slots, rows, cols)
    groups_shape = (copies, 3, padded, max_cols // 16)  # (copies, slots, rows, groups)
    scratch = Scratch(
        np.empty((n_rows, (n_heads + 2 * n_kv) * hd), np.float32),  # qkv (N, q|k|v)
        np.empty((n_rows, n_heads * hd), np.float32),  # attn (N, heads * hd) attention output
        np.empty((n_rows, n_ff), np.float32),  # act (N, n_ff) activated gate * up
        np.empty((n_rows, n_embd), np.float32),  # proj (N, n_embd) a product before its post norm
        np.empty((n_threads, n_embd), np.float32),  # normed (threads, n_embd) a normed row
        np.empty(rounded_shape, np.float32),  # values: rounded inputs
        np.zeros(rounded_shape, np.int8),  # ints: their integer codes
        np.zeros(groups_shape, np.float32),  # int_scales: code scales
        np.zeros(groups_shape, np.float32),  # sums: group sums
        np.empty((n_threads, hd), np.float32),  # q_buf (threads, hd) one q head
        np.empty((n_threads, attend_floats), np.float32),  # scores (threads, attention scratch)
        np.arange(n_rows, dtype=np.int64),  # all_rows (N,) every row, in order
    )
    return scratch, np.zeros((2, n_stages), np.int64)  # (claimed | done, stages)


@numba.njit(parallel=PRANGE_ONLY, cache=True, no_cfunc_wrapper=True)
def forward_rows(n_threads, x, model, rows, logits, scratch, counters):
    """Rows x (N, n_embd) through every layer, updated in place; each row's k and v go to its
    cache at its position; logits (M, vocab) get the head's output for rows.head_rows.
    ``model`` is the StepModel fused.FusedForward builds, ``scratch`` and ``counters`` from
    new_scratch. One region of ``n_threads`` threads; stage_calls.prepare(forward_rows, args)
    first (the stages' addresses)."""
    solo = x.shape[0] <= SOLO_ROWS
    qkv, attn, act, proj, normed, values, ints, int_scales, sums, q_buf, scores, all_rows = scratch
    claimed, done = counters[0], counters[1]
    # A parallel loop's body may only capture arrays and scalars, not tuples of arrays: unpack
    # here, repack per thread.
    q, scales, mins, bias, floats, gelu = model.weights
    linears, head, norms, qk_norms, output_norm, layer_info, dims, eps, scale = model[1:]
    positions, caches, cos, sin, head_rows = rows
    for tid in numba.prange(n_threads):
        # np.int64: the loop index is int64 where numba types this body and uint64 where the
        # parallel loop runs it, and each would compile its own run_stages (~8 s of a cold start).
        # Every array borrowed (borrow.py): no atomic reference counts shared by the threads.
        b = borrowed
        stage(
            RUN_AT,
            (
                np.int64(tid),
                b(x),
                StepModel(
                    StepWeights(b(q), b(scales), b(mins), b(bias), b(floats), b(gelu)),
                    b(linears),
                    b(head),
                    b(norms),
                    b(qk_norms),
                    b(output_norm),
                    b(layer_info),
                    b(dims),
                    eps,
                    scale,
                ),
                StepRows(b(positions), b(caches), b(cos), b(sin), b(head_rows)),
                Scratch(
                    b(qkv),
                    b(attn),
                    b(act),
                    b(proj),
                    b(normed),
                    b(values),
                    b(ints),
                    b(int_scales),
                    b(sums),
                    b(q_buf),
                    b(scores),
                    b(all_rows),
                ),
                b(logits),
                (b(claimed), b(done)),
                solo,
            ),
        )


def forward_signature() -> tuple:
    """The numba argument types of forward_rows as fused.FusedForward passes them: the same for
    every model (the dtypes, dimensions and layouts of its arrays are fixed), so a cold start
    can hand them to the second compiling process before the weights are loaded (start_early)."""

    def a(dtype, ndim: int) -> np.ndarray:
        return np.zeros((1,) * ndim, dtype)  # a C-contiguous, writable array of this kind

    f32, i64, i8 = np.float32, np.int64, np.int8
    weights = StepWeights(a(i8, 1), a(f32, 1), a(f32, 1), a(f32, 1), a(f32, 1), a(f32, 1))
    model = StepModel(
        weights, a(i64, 3), a(i64, 2), a(f32, 3), a(f32, 3), a(f32, 1), a(i64, 2), a(i64, 1), f32(1), f32(1)
    )
    rows = StepRows(a(i64, 1), a(i64, 2), a(f32, 3), a(f32, 3), a(i64, 1))
    scratch = Scratch(
        *[a(f32, 2)] * 5, a(f32, 4), a(i8, 4), a(f32, 4), a(f32, 4), a(f32, 2), a(f32, 2), a(i64, 1)
    )
    args = (1, a(f32, 2), model, rows, a(f32, 2), scratch, a(i64, 2))
    return tuple(forward_rows.typeof_pyval(v) for v in args)


def compile_ahead() -> None:
    """A cold start of a model with the fused forward: start compiling it in the second process
    now, while this one loads the weights (stage_calls.start_early)."""
    start_early(forward_rows, forward_signature())


# What a cold start compiles in a second process (started before the weights load: compile_ahead)
# while this one compiles the rest (compile_split.py): the region, its stages for attention and
# the k/v cache; here the products, the rounding and the FFN. Each side first types its part of
# the forward (stage_calls.discover, ~2-3 s with the helpers that typing compiles). Balanced on
# SmolLM2 (2026-12-02, AVX-512 VNNI machine): ~10-11 s CPU each of a ~22 s cold start. The
# narrow tiles (the products of a lockstep batch) went there too when they came.
compile_elsewhere(forward_rows, run_stages, attend_stage, attend_tile, attend_head, kv_stage, dot_tile_narrow)
