"""Two threads streaming one big Q5_0 matrix from memory: the int8 copy against the file's blocks.

    .venv/bin/python bench/q5_stream.py [--rows 151936] [--cols 896] [--reps 7] [--threads 2]

A decode step is bound by memory bandwidth only when both cores read: one thread is bound by
its instructions. So this times the decode pair kernels (step_products.dot_one_row's
loop: two weight rows a call, prefetch ~3 KB ahead) over a matrix far larger than the caches,
each thread taking half the rows, and prints wall Gweights/s and GB/s of each layout,
interleaved A/B/A/B so both see the same load. Synthetic codes -16..15 and f16 scales.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from inference.engine.jit.intrinsics import prefetch  # noqa: E402
from inference.engine.quants.formats import Q5_0  # noqa: E402
from inference.engine.quants.intdot import HOST_SIMD, dot_pair_int  # noqa: E402
from inference.engine.quants.quint import WIDE, dot_pair_quint, wide_dot_quad_quint  # noqa: E402

PREFETCH_BYTES = 3072


@numba.njit(parallel=True, cache=True)
def stream_int8(q, scales, ints, int_scales, rows, cols, out, passes, prefetch_bytes=PREFETCH_BYTES):
    """out[r] = row r of the int8 copy times the activation, rows split between the threads."""
    groups = cols >> 5
    n_threads = numba.get_num_threads()
    for t in numba.prange(n_threads):
        r0, r1 = rows * t // n_threads // 2 * 2, rows * (t + 1) // n_threads // 2 * 2
        block = np.empty(2, np.float32)
        ahead = max(1, prefetch_bytes // cols) * cols
        for i in range(0, (r1 - r0) * passes, 2):
            r = r0 + i % (r1 - r0)
            start = r * cols
            for i in range(start + ahead, min(start + ahead + 2 * cols, rows * cols), 64):
                prefetch(q, i)
            dot_pair_int(
                q,
                start,
                start + cols,
                ints,
                scales,
                r * groups,
                (r + 1) * groups,
                int_scales,
                groups,
                5,
                block,
            )
            out[r], out[r + 1] = block[0], block[1]


@numba.njit(parallel=True, cache=True)
def stream_quint(q, scales, ints, int_scales, rows, cols, out, passes, prefetch_bytes=PREFETCH_BYTES):
    """out[r] = row r of the Q5_0 blocks times the activation, rows split between the threads."""
    groups = cols >> 5
    row_bytes = groups * 22
    n_threads = numba.get_num_threads()
    for t in numba.prange(n_threads):
        r0, r1 = rows * t // n_threads // 2 * 2, rows * (t + 1) // n_threads // 2 * 2
        block = np.empty(2, np.float32)
        ahead = max(1, prefetch_bytes // row_bytes) * row_bytes
        for i in range(0, (r1 - r0) * passes, 2):
            r = r0 + i % (r1 - r0)
            start = r * row_bytes
            for i in range(start + ahead, min(start + ahead + 2 * row_bytes, rows * row_bytes), 64):
                prefetch(q, i)
            dot_pair_quint(q, start, start + row_bytes, ints, scales, 0, 0, int_scales, groups, block)
            out[r], out[r + 1] = block[0], block[1]


@numba.njit(parallel=True, cache=True)
def stream_quint_quad(q, scales, ints, int_scales, rows, cols, out, passes):
    """stream_quint four rows a call (two 512-bit pairs sharing the activation's work)."""
    groups = cols >> 5
    row_bytes = groups * 22
    n_threads = numba.get_num_threads()
    for t in numba.prange(n_threads):
        r0, r1 = rows * t // n_threads // 4 * 4, rows * (t + 1) // n_threads // 4 * 4
        block = np.empty(4, np.float32)
        ahead = max(1, PREFETCH_BYTES // row_bytes) * row_bytes
        for i in range(0, (r1 - r0) * passes, 4):
            r = r0 + i % (r1 - r0)
            start = r * row_bytes
            for j in range(start + ahead, min(start + ahead + 4 * row_bytes, rows * row_bytes), 64):
                prefetch(q, j)
            wide_dot_quad_quint(q, start, start + row_bytes, ints, scales, 0, 0, int_scales, groups, block)
            out[r], out[r + 1], out[r + 2], out[r + 3] = block[0], block[1], block[2], block[3]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=151936)
    parser.add_argument("--cols", type=int, default=896)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--prefetch", type=int, nargs="*", default=[], help="also: blocks prefetched this far"
    )
    parser.add_argument("--passes", type=int, default=1, help="passes over the rows (small rows: from cache)")
    args = parser.parse_args()
    numba.set_num_threads(args.threads)
    rows, cols = args.rows, args.cols
    rng = np.random.default_rng(0)
    q = rng.integers(-16, 16, (rows, cols), dtype=np.int8)  # (rows, cols)
    scales = rng.standard_normal((rows, cols // 32)).astype(np.float16).astype(np.float32)  # (rows, groups)
    blocks = Q5_0.pack_rows(q, scales).ravel().view(np.int8)  # (rows * quint_row_bytes,)
    ints = rng.integers(-127, 128, cols, dtype=np.int8)  # (cols,)
    int_scales = rng.random(cols // 32).astype(np.float32)  # (groups,)
    flat_q, flat_s = q.ravel(), scales.ravel()
    out_a, out_b = np.empty(rows, np.float32), np.empty(rows, np.float32)
    runs = {
        "int8 copy": (
            lambda: stream_int8(flat_q, flat_s, ints, int_scales, rows, cols, out_a, args.passes),
            q.nbytes + scales.nbytes,
        ),
        "Q5_0 blocks": (
            lambda: stream_quint(blocks, flat_s, ints, int_scales, rows, cols, out_b, args.passes),
            blocks.nbytes,
        ),
    }
    if WIDE:
        out_c = np.empty(rows, np.float32)
        runs["Q5_0 quads"] = (
            lambda: stream_quint_quad(blocks, flat_s, ints, int_scales, rows, cols, out_c, args.passes),
            blocks.nbytes,
        )
    for far in args.prefetch:
        out_int8 = np.empty(rows, np.float32)
        runs[f"int8 pf{far}"] = (
            lambda far=far, out_int8=out_int8: stream_int8(
                flat_q, flat_s, ints, int_scales, rows, cols, out_int8, args.passes, far
            ),
            q.nbytes + scales.nbytes,
        )
        out_far = np.empty(rows, np.float32)
        runs[f"blocks pf{far}"] = (
            lambda far=far, out_far=out_far: stream_quint(
                blocks, flat_s, ints, int_scales, rows, cols, out_far, args.passes, far
            ),
            blocks.nbytes,
        )
    times = {name: [] for name in runs}
    for run, _ in runs.values():
        run()  # compile and warm
    assert np.array_equal(out_a, out_b), "the two layouts gave different bits"
    assert not WIDE or np.array_equal(out_a, out_c), "the quads gave different bits"
    for _ in range(args.reps):
        for name, (run, _) in runs.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    load = os.getloadavg()[0]
    print(f"{rows}x{cols} x{args.passes}, {args.threads} threads, {HOST_SIMD}, load average {load:.2f}")
    for name, (_, nbytes) in runs.items():
        t, weights = statistics.median(times[name]), rows * cols * args.passes
        print(
            f"  {name:12s} {nbytes / 1e6:7.1f} MB  median {t * 1e3:6.2f} ms"
            f"  (min {min(times[name]) * 1e3:6.2f})  {weights / t / 1e9:5.1f} Gweights/s"
            f"  {nbytes * args.passes / t / 1e9:5.1f} GB/s"
        )


if __name__ == "__main__":
    main()
