"""Where a decode step's time goes: wall time per stage of the fused forward, per op kind.

    .venv/bin/python bench/decode_breakdown.py [--model PATH ...] [--threads 2] [--steps 64]

Runs the same stages as step_region.run_stages (the engine's stage functions, in the same
order, over the same counters) with a cycle-counter stamp after each stage in each thread, so
a stage's wall time is the time from the previous stage's end to its end (the barrier
included). Stamps are converted with the cycle counter's rate measured against perf_counter.
Also reports the whole ``decode_one`` (Python glue, embedding, RoPE tables, logits) against
the kernel region alone. Measure on a quiet machine; read the shares, not the absolute ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from inference.engine.engine import Engine  # noqa: E402
from inference.engine.fused import step_region as sr  # noqa: E402
from inference.engine.fused.step_attention import attend_stage  # noqa: E402
from inference.engine.fused.step_kernels import (  # noqa: E402
    ATTEND,
    DOWN,
    FFN,
    FFN_POST,
    FLAGS,
    GELU,
    KV,
    N_FF,
    OUT,
    OUT_POST,
    POST_NORMS,
    PREP_DOWN,
    PREP_FFN,
    PREP_OUT,
    PREP_QKV,
    QKV,
    SLOT_DOWN,
    SLOT_GATE,
    SLOT_OUT,
    SLOT_Q,
    STAGES_PER_LAYER,
    Rounded,
    StepModel,
    StepRows,
    StepWeights,
    add_normed_stage,
    kv_stage,
    prepare_stage,
)
from inference.engine.fused.step_products import ffn_stage, rows_stage  # noqa: E402
from inference.engine.jit import stage_calls  # noqa: E402
from inference.engine.models.base import Run  # noqa: E402

START_LAG = 2e-4  # s: steps whose threads started farther apart are left out of the stages

NAMES = [
    "prep_qkv",
    "qkv",
    "kv",
    "attend",
    "prep_out",
    "out",
    "out_post",
    "prep_ffn",
    "ffn",
    "prep_down",
    "down",
    "ffn_post",
]


@intrinsic
def cycles(typingctx):
    """The CPU's cycle counter (rdtsc: constant rate on this machine)."""

    def codegen(context, builder, signature, args):
        signature = ir.FunctionType(ir.IntType(64), [])
        fn = cgutils.get_or_insert_function(builder.module, signature, "llvm.readcyclecounter")
        return builder.call(fn, [])

    return types.int64(), codegen


@numba.njit
def _layer(tid, layer, x, model, rows, scratch, rounded, counters, solo, stamps):
    w, dims, eps, lin = model.weights, model.dims, model.eps, model.linears[layer]
    stage, n_rows, n_layers = layer * STAGES_PER_LAYER, x.shape[0], model.linears.shape[0]
    window, rope = model.layer_info[layer, 0], model.layer_info[layer, 1]
    normed, no_norm, post = scratch.normed[tid], model.output_norm[:0], dims[FLAGS] & POST_NORMS
    qkv_lin, out_lin, ffn_lin, down_lin = (
        lin[SLOT_Q:SLOT_OUT],
        lin[SLOT_OUT:SLOT_GATE],
        lin[SLOT_GATE:SLOT_DOWN],
        lin[SLOT_DOWN:],
    )
    prepare_stage(
        x,
        scratch.all_rows,
        model.norms[layer, 0],
        eps,
        qkv_lin,
        rounded,
        normed,
        solo,
        counters,
        stage + PREP_QKV,
    )
    stamps[tid, stage + PREP_QKV] = cycles()
    rows_stage(w, qkv_lin, rounded, n_rows, scratch.qkv, False, counters, stage + QKV, tid)
    stamps[tid, stage + QKV] = cycles()
    kv_stage(
        scratch.qkv, model.qk_norms[layer, 1], eps, rows, rope, dims, layer, n_layers, counters, stage + KV
    )
    stamps[tid, stage + KV] = cycles()
    attend_stage(
        scratch.qkv,
        model.qk_norms[layer, 0],
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
        stage + ATTEND,
    )
    stamps[tid, stage + ATTEND] = cycles()
    prepare_stage(
        scratch.attn,
        scratch.all_rows,
        no_norm,
        eps,
        out_lin,
        rounded,
        normed,
        solo,
        counters,
        stage + PREP_OUT,
    )
    stamps[tid, stage + PREP_OUT] = cycles()
    if post:
        rows_stage(w, out_lin, rounded, n_rows, scratch.proj, False, counters, stage + OUT, tid)
        stamps[tid, stage + OUT] = cycles()
        add_normed_stage(x, scratch.proj, model.norms[layer, 1], eps, counters, stage + OUT_POST)
    else:
        rows_stage(w, out_lin, rounded, n_rows, x, True, counters, stage + OUT, tid)
        stamps[tid, stage + OUT] = cycles()
    stamps[tid, stage + OUT_POST] = cycles()
    prepare_stage(
        x,
        scratch.all_rows,
        model.norms[layer, 2],
        eps,
        ffn_lin,
        rounded,
        normed,
        solo,
        counters,
        stage + PREP_FFN,
    )
    stamps[tid, stage + PREP_FFN] = cycles()
    ffn_stage(w, ffn_lin, rounded, dims[N_FF], dims[FLAGS] & GELU, scratch.act, counters, stage + FFN, tid)
    stamps[tid, stage + FFN] = cycles()
    prepare_stage(
        scratch.act,
        scratch.all_rows,
        no_norm,
        eps,
        down_lin,
        rounded,
        normed,
        solo,
        counters,
        stage + PREP_DOWN,
    )
    stamps[tid, stage + PREP_DOWN] = cycles()
    if post:
        rows_stage(w, down_lin, rounded, n_rows, scratch.proj, False, counters, stage + DOWN, tid)
        stamps[tid, stage + DOWN] = cycles()
        add_normed_stage(x, scratch.proj, model.norms[layer, 3], eps, counters, stage + FFN_POST)
    else:
        rows_stage(w, down_lin, rounded, n_rows, x, True, counters, stage + DOWN, tid)
        stamps[tid, stage + DOWN] = cycles()
    stamps[tid, stage + FFN_POST] = cycles()


@numba.njit
def _run(tid, x, model, rows, scratch, logits, counters, solo, stamps):
    copy = np.int64(tid) if solo else np.int64(0)
    rounded = Rounded(scratch.values[copy], scratch.ints[copy], scratch.int_scales[copy], scratch.sums[copy])
    stamps[tid, stamps.shape[1] - 1] = cycles()  # region start
    n_layers = model.linears.shape[0]
    for layer in range(n_layers):
        _layer(tid, layer, x, model, rows, scratch, rounded, counters, solo, stamps)
    stage = n_layers * STAGES_PER_LAYER
    head_rows = rows.head_rows
    prepare_stage(
        x,
        head_rows,
        model.output_norm,
        model.eps,
        model.head,
        rounded,
        scratch.normed[tid],
        solo,
        counters,
        stage,
    )
    stamps[tid, stage] = cycles()
    n_head = head_rows.shape[0]
    rows_stage(model.weights, model.head, rounded, n_head, logits, False, counters, stage + 1, tid)
    stamps[tid, stage + 1] = cycles()


@numba.njit(parallel=True)
def _all_threads(n_threads, x, model, rows, scratch, logits, counters, solo, stamps):
    q, scales, mins, bias, floats, gelu = model.weights
    linears, head, norms, qk_norms, output_norm, layer_info, dims, eps, scale = model[1:]
    positions, caches, cos, sin, head_rows = rows
    qkv, attn, act, proj, normed, values, ints, int_scales, sums, q_buf, scores, all_rows = scratch
    claimed, done = counters
    for tid in numba.prange(n_threads):
        _run(
            tid,
            x,
            StepModel(
                StepWeights(q, scales, mins, bias, floats, gelu),
                linears,
                head,
                norms,
                qk_norms,
                output_norm,
                layer_info,
                dims,
                eps,
                scale,
            ),
            StepRows(positions, caches, cos, sin, head_rows),
            sr.Scratch(qkv, attn, act, proj, normed, values, ints, int_scales, sums, q_buf, scores, all_rows),
            logits,
            (claimed, done),
            solo,
            stamps,
        )


def _scratch(n_threads, x, model, rows):
    """The scratch forward_rows allocates (built here by calling it once with a hook would
    cost more code than this copy of its shapes)."""
    from inference.engine.fused.attention_tile import attend_scratch_size
    from inference.engine.fused.step_kernels import COLS, HEAD_DIM, N_HEADS, N_KV

    dims, n_embd = model.dims, x.shape[1]
    n_heads, hd = dims[N_HEADS], dims[HEAD_DIM]
    max_cols = max(model.linears[:, :, COLS].max(), model.head[0, COLS])
    attend = attend_scratch_size(rows.positions.max() + 1, hd, hd, n_heads // dims[N_KV])
    return sr.Scratch(
        np.empty((1, (n_heads + 2 * dims[N_KV]) * hd), np.float32),  # (1, q|k|v)
        np.empty((1, n_heads * hd), np.float32),  # (1, heads * hd)
        np.empty((1, dims[N_FF]), np.float32),  # (1, n_ff)
        np.empty((1, n_embd), np.float32),  # (1, n_embd)
        np.empty((n_threads, n_embd), np.float32),  # (threads, n_embd)
        np.empty((n_threads, 3, 4, max_cols), np.float32),  # (copies, slots, rows, cols)
        np.zeros((n_threads, 3, 4, max_cols), np.int8),  # (copies, slots, rows, cols)
        np.zeros((n_threads, 3, 4, max_cols // 16), np.float32),  # (copies, slots, rows, groups)
        np.zeros((n_threads, 3, 4, max_cols // 16), np.float32),  # (copies, slots, rows, groups)
        np.empty((n_threads, hd), np.float32),  # (threads, hd)
        np.empty((n_threads, attend), np.float32),  # (threads, scratch)
        np.arange(1),  # (1,)
    )


def breakdown(path: Path, n_threads: int, steps: int, context: int) -> None:
    engine = Engine.load(path)
    model = engine.model
    fused = model.fused
    cache = engine.new_cache(2048)
    engine.prefill(cache, list(range(100, 100 + context)))
    n_layers = fused.model.linears.shape[0]
    n_stages = (n_layers + 1) * STAGES_PER_LAYER
    n_used = n_layers * STAGES_PER_LAYER + 2  # every layer's stages, the head's two
    per_stage = np.zeros((steps, n_used))
    whole, region, lag = [], [], []
    rate = None
    for step in range(steps + 3):
        plan = model.row_plan([_run_of(cache)])
        x = np.array(model.embed(np.array([7], np.int64)), np.float32)  # (1, n_embd)
        logits = np.empty((1, fused.vocab), np.float32)  # (1, vocab)
        stamps = np.zeros((n_threads, n_stages + 1), np.int64)  # (threads, stages | start)
        counters = (np.zeros(n_stages, np.int64), np.zeros(n_stages, np.int64))
        scratch = _scratch(n_threads, x, fused.model, plan.kernel_rows())
        args = (n_threads, x, fused.model, plan.kernel_rows(), scratch, logits, counters, True, stamps)
        stage_calls.prepare(_all_threads, args, fused.features)  # the stages make pointer calls
        t0, c0 = time.perf_counter(), _now()
        _all_threads(*args)
        t1, c1 = time.perf_counter(), _now()
        rate = (c1 - c0) / (t1 - t0)
        t2 = time.perf_counter()
        engine.decode_one(cache, 7)  # the real step, for the glue's share (commits a token)
        whole.append(time.perf_counter() - t2)
        region.append(t1 - t0)
        if step >= 3:
            # Thread 0's own clock: each stage from its end of the previous one (barrier included).
            per_stage[step - 3] = np.diff(np.concatenate([stamps[0, -1:], stamps[0, :n_used]])) / rate
            lag.append((stamps[:, -1].max() - stamps[:, -1].min()) / rate)
    # Steps in which a thread started late (another process had its core: the other thread ran
    # the stages alone) say nothing about the stages: left out.
    together = np.array(lag) < START_LAG
    if together.sum() >= steps // 4:
        per_stage = per_stage[together]
    kinds, total = op_times(per_stage, n_layers)
    print(f"### {path.name}: {n_threads} threads, context {context}, median of {steps} steps")
    print(
        f"decode_one {statistics.median(whole) * 1e3:.2f} ms, instrumented region "
        f"{statistics.median(region) * 1e3:.2f} ms, sum of stages {total:.2f} ms, last thread in "
        f"{statistics.median(lag) * 1e3:.3f} ms after the first; stages of the {together.sum()} of "
        f"{steps} steps that started within {START_LAG * 1e3:.1f} ms"
    )
    print_op_table(kinds, total, "ms/token")


def op_times(per_stage: np.ndarray, n_layers: int) -> tuple[dict[str, float], float]:
    """Median ms of each op kind summed over the layers, from per-run stage times
    (runs, stages) in seconds; and their total."""
    med = np.median(per_stage, axis=0) * 1e3  # (stages,) ms
    kinds = {
        name: med[i : n_layers * STAGES_PER_LAYER : STAGES_PER_LAYER].sum() for i, name in enumerate(NAMES)
    }
    kinds["head_prep"], kinds["head"] = med[-2], med[-1]
    return kinds, float(med.sum())


def print_op_table(kinds: dict[str, float], total: float, unit: str) -> None:
    """A markdown table of the op kinds, the costliest first."""
    print(f"| op | {unit} | share |")
    print("|---|---|---|")
    for name, ms in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {ms:.3f} | {100 * ms / total:.1f}% |")


@numba.njit
def _now_kernel():
    return cycles()


def _now() -> int:
    return _now_kernel()


def _run_of(cache):
    return Run(cache, [7])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--context", type=int, default=32, help="tokens in the cache before decoding")
    args = parser.parse_args()
    numba.set_num_threads(args.threads)
    for path in args.model or [ROOT / "models/qwen2.5-coder-0.5b-instruct.gguf"]:
        breakdown(path, args.threads, args.steps, args.context)


if __name__ == "__main__":
    main()
