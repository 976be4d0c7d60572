"""Where a short prefill's time goes: wall time per stage of the fused forward, N token rows.

    .venv/bin/python bench/prefill_breakdown.py [--model PATH ...] [--rows 16] [--threads 2] [--reps 32]

decode_breakdown.py's instrumented copy of the stage list (a cycle-counter stamp after each
stage in each thread) run over a prefill chunk of ``--rows`` tokens into an empty cache
instead of one decode row: a stage's wall time is from the previous stage's end to its end in
thread 0 (the barrier included). Also the real ``Engine.prefill`` of the same tokens against
the instrumented region alone. Read the shares, not the absolute ms, on a busy machine; when
another process holds a core, thread 0 may start after the other thread has done most stages
(every stage then shows ~0 ms but the last few): rerun when the sum of stages is far below the
region's time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numba
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "lab"))

from decode_breakdown import _all_threads, _now, op_times, print_op_table  # noqa: E402

from inference.engine.engine import Engine  # noqa: E402
from inference.engine.fused import step_region as sr  # noqa: E402
from inference.engine.fused.step_kernels import STAGES_PER_LAYER  # noqa: E402
from inference.engine.jit import stage_calls  # noqa: E402
from inference.engine.models.base import Run  # noqa: E402


def _one(engine, tokens, n_threads: int):
    """One instrumented forward of ``tokens`` into a new cache: (stamps, region seconds, rate)."""
    model, fused = engine.model, engine.model.fused
    cache = engine.new_cache(len(tokens) + 8)
    plan = model.row_plan([Run(cache, tokens)])
    rows = plan.kernel_rows()
    x = np.array(model.embed(np.array(tokens, np.int64)), np.float32)  # (N, n_embd)
    logits = np.empty((1, fused.vocab), np.float32)  # (1, vocab)
    scratch, counters = sr.new_scratch(n_threads, x, fused.model, rows)
    n_stages = counters.shape[1]
    stamps = np.zeros((n_threads, n_stages + 1), np.int64)  # (threads, stages | start)
    args = (n_threads, x, fused.model, rows, scratch, logits, (counters[0], counters[1]), False, stamps)
    stage_calls.prepare(_all_threads, args, fused.features)  # the stages make pointer calls
    t0, c0 = time.perf_counter(), _now()
    _all_threads(*args)
    t1, c1 = time.perf_counter(), _now()
    return stamps, t1 - t0, (c1 - c0) / (t1 - t0)


def breakdown(path: Path, n_rows: int, n_threads: int, reps: int) -> None:
    engine = Engine.load(path)
    n_layers = engine.model.fused.model.linears.shape[0]
    n_used = n_layers * STAGES_PER_LAYER + 2  # every layer's stages, the head's two
    tokens = list(np.random.default_rng(0).integers(100, 1000, n_rows))
    per_stage, region, whole = np.zeros((reps, n_used)), [], []
    engine.prefill(engine.new_cache(n_rows + 8), tokens)  # the real forward's stages get addresses first
    for rep in range(reps + 3):
        stamps, seconds, rate = _one(engine, tokens, n_threads)
        cache = engine.new_cache(n_rows + 8)
        t0 = time.perf_counter()
        engine.prefill(cache, tokens)
        whole.append(time.perf_counter() - t0)
        if rep >= 3:
            region.append(seconds)
            per_stage[rep - 3] = np.diff(np.concatenate([stamps[0, -1:], stamps[0, :n_used]])) / rate
    kinds, total = op_times(per_stage, n_layers)
    print(f"### {path.name}: {n_rows} rows, {n_threads} threads, median of {reps}")
    print(
        f"Engine.prefill {statistics.median(whole[3:]) * 1e3:.2f} ms, instrumented region "
        f"{statistics.median(region) * 1e3:.2f} ms, sum of stages {total:.2f} ms"
    )
    print_op_table(kinds, total, "ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", type=Path)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=32)
    args = parser.parse_args()
    numba.set_num_threads(args.threads)
    for path in args.model or [ROOT / "models/qwen2.5-coder-0.5b-instruct.gguf"]:
        breakdown(path, args.rows, args.threads, args.reps)


if __name__ == "__main__":
    main()
