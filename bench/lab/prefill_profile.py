"""Where a prefill's time goes: the whole forward against its products, one thread, CPU time.

    .venv/bin/python bench/prefill_profile.py [--model PATH ...] [--sizes 64,256] [--reps 3]

For each model and prompt length: CPU seconds per token of a whole prefill (one thread, so
no waits), then the same rows' products alone, per product stage of one layer (the q|k|v,
out, gate|up and down linears, each stage of the fused forward run by itself on rounded
random rows), times the layer count. What is left is attention, norms, RoPE, rounding and
the head. CPU time (``time.process_time``) is what the machine's load inflates least.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numba  # noqa: E402
import numpy as np  # noqa: E402

from inference.engine.engine import Engine  # noqa: E402
from inference.engine.fused import step_kernels as sk  # noqa: E402
from inference.engine.fused import step_products as sp  # noqa: E402
from inference.engine.jit import stage_calls  # noqa: E402
from inference.engine.quants.intdot import HOST_SIMD, ROW_BLOCK  # noqa: E402

DEFAULT_MODELS = [ROOT / "models/qwen2.5-coder-0.5b-instruct.gguf", ROOT / "models/gemma-3-270m-q4_k_m.gguf"]
STAGES = {
    "qkv": (sk.SLOT_Q, sk.SLOT_OUT),
    "out": (sk.SLOT_OUT, sk.SLOT_GATE),
    "ffn": (sk.SLOT_GATE, sk.SLOT_DOWN),
    "down": (sk.SLOT_DOWN, sk.SLOT_DOWN + 1),
}


def _rounded(linears: np.ndarray, n: int) -> sk.Rounded:
    """Rounded random inputs for ``linears`` (k, fields): n rows per slot."""
    cols = int(linears[:, sk.COLS].max())
    padded = -(-n // ROW_BLOCK) * ROW_BLOCK
    k = linears.shape[0]
    rounded = sk.Rounded(
        np.zeros((k, padded, cols), np.float32),  # (slots, rows, cols)
        np.zeros((k, padded, cols), np.int8),
        np.zeros((k, padded, cols // 16), np.float32),  # (slots, rows, groups)
        np.zeros((k, padded, cols // 16), np.float32),
    )
    x = np.random.default_rng(0).standard_normal((n, cols)).astype(np.float32)  # (n, cols)
    for i in range(n):
        sk.round_inputs(linears, x[i], rounded, i)
    return rounded


def _stage_seconds(model, name: str, n: int, reps: int) -> float:
    """CPU seconds of one layer's product stage ``name`` over n rows (best of reps)."""
    lo, hi = STAGES[name]
    linears = model.linears[0, lo:hi]
    rounded = _rounded(linears, n)
    best = float("inf")
    for _ in range(reps):
        counters = (np.zeros(1, np.int64), np.zeros(1, np.int64))
        t0 = time.process_time()
        if name == "ffn":
            act = np.empty((n, int(model.dims[sk.N_FF])), np.float32)  # (n, n_ff)
            args = (model.weights, linears, rounded, model.dims[sk.N_FF], model.dims[sk.FLAGS] & sk.GELU)
            stage, args = sp.ffn_stage, (*args, act, counters, 0, 0)
        else:
            out = np.empty((n, int(linears[:, sk.ROWS].sum())), np.float32)  # (n, rows)
            stage, args = sp.rows_stage, (model.weights, linears, rounded, n, out, False, counters, 0, 0)
        stage_calls.prepare(stage, args)  # the stage calls dot_run through a pointer
        stage(*args)
        best = min(best, time.process_time() - t0)
    return best


def profile(path: Path, sizes: list[int], reps: int) -> None:
    engine = Engine.load(path)
    model = engine.model.fused.model
    n_layers = model.linears.shape[0]
    rng = np.random.default_rng(1)
    print(f"### {path.name} ({HOST_SIMD}, 1 thread, CPU ms per token)")
    print("| pp | forward | qkv | out | ffn | down | products | rest |")
    print("|---|---|---|---|---|---|---|---|")
    for n in sizes:
        tokens = rng.integers(100, 1000, n).tolist()
        cache = engine.new_cache(n + 8)
        engine.prefill(cache, tokens)  # compile / warm
        best = float("inf")
        for _ in range(reps):
            cache.truncate(0)
            t0 = time.process_time()
            engine.prefill(cache, tokens)
            best = min(best, time.process_time() - t0)
        stages = {s: _stage_seconds(model, s, n, reps) * n_layers for s in STAGES}
        products = sum(stages.values())
        cells = [best] + [stages[s] for s in STAGES] + [products, best - products]
        print(f"| {n} | " + " | ".join(f"{1e3 * c / n:.3f}" for c in cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", type=Path)
    parser.add_argument("--sizes", default="64,256")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    numba.set_num_threads(1)
    for path in args.model or DEFAULT_MODELS:
        profile(path, [int(s) for s in args.sizes.split(",")], args.reps)


if __name__ == "__main__":
    main()
