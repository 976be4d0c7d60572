"""Prefill attention alone: the one-row kernel against the tiled one, on one thread.

    .venv/bin/python bench/attention_kernel.py [--keys 8192] [--rows 36] [--heads 14 --kv 2 --hd 64]

A chunk of --rows query rows at cache position --keys over a cache of random f16 rows (Qwen2.5's
geometry by default), through kernels.attend_rows (per (row, head)) and
attention_tile.attend_rows_tiled (tiles of rows x the heads of a kv head, 16 and 8 lanes). Both
give the same bits (checked here too); printed: CPU ns per (query head, key) and GFLOP/s (4 hd
flops per pair: the scores' and the values' FMAs). CPU time, so other load on the machine
matters less than for wall time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from inference.engine.fused.attention_tile import TILE_QUERIES, attend_rows_tiled  # noqa: E402
from inference.engine.fused.kernels import attend_rows  # noqa: E402


def _cpu_seconds(run, reps: int) -> float:
    run()  # compile / warm
    best = float("inf")
    for _ in range(reps):
        t0 = time.process_time()
        run()
        best = min(best, time.process_time() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=8192, help="cache position of the chunk")
    parser.add_argument("--rows", type=int, default=36)
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv", type=int, default=2)
    parser.add_argument("--hd", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    numba.set_num_threads(1)
    rng = np.random.default_rng(0)
    shape = (args.kv, args.keys + args.rows, args.hd)
    keys = rng.standard_normal(shape).astype(np.float16).view(np.uint16)  # (kvh, ctx, hd)
    values = rng.standard_normal(shape).astype(np.float16).view(np.uint16)  # (kvh, ctx, hd)
    q = rng.standard_normal((args.rows, args.heads, args.hd)).astype(np.float32)  # (rows, heads, hd)
    scale = np.float32(1.0 / np.sqrt(args.hd))
    pairs = args.rows * args.heads * (args.keys + (args.rows + 1) / 2)
    expected = np.empty_like(q)  # (rows, heads, hd)
    runs = {"one row": lambda: attend_rows(q, keys, values, args.keys, 0, scale, expected)}
    outputs = {}
    per_tile = max(1, TILE_QUERIES // (args.heads // args.kv))
    for lanes in (16, 8):
        outputs[lanes] = np.empty_like(q)
        runs[f"tiled, {lanes} lanes"] = lambda lanes=lanes: attend_rows_tiled(
            q, keys, values, args.keys, 0, scale, outputs[lanes], per_tile, lanes
        )
    print(f"{args.rows} rows x {args.heads} heads at position {args.keys}, head_dim {args.hd}, 1 thread")
    for name, run in runs.items():
        seconds = _cpu_seconds(run, args.reps)
        gflops = pairs * 4 * args.hd / seconds / 1e9
        print(f"  {name:>16}: {seconds / pairs * 1e9:.2f} ns per (head, key), {gflops:.0f} GFLOP/s")
    for lanes, got in outputs.items():
        assert np.array_equal(got.view(np.uint32), expected.view(np.uint32)), f"{lanes} lanes differ"
    print("  outputs bitwise equal")


if __name__ == "__main__":
    main()
