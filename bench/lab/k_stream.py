"""Threads streaming one big Q6_K or Q4_K matrix: the int8 / nibble layout against the file's
super-blocks (quants/kblocks.py).

    .venv/bin/python bench/k_stream.py [--rows 10752] [--cols 4864] [--reps 7] [--threads 2]
        [--passes 1] [--formats q6_k q4_k]

Times the decode kernels as step_products.dot_one_row runs them (the layout's pairs and the
blocks' pairs prefetching ~3-12 KB ahead before each call; the blocks' quads, four rows a
call, prefetching inside their loop, and as they ran before, a burst before each call), each
thread taking its share of the rows, interleaved A/B so both
see the same load; checks both give the same bits. The default shape is Qwen2.5-Coder-0.5B's
twelve ffn_down matrices stacked (896 rows each). ``--rows 256 --passes 200 --threads 1``:
one thread from L2 (the kernel's instruction rate). Beside the wall-clock rate, bytes per
second of CPU time times the threads: what the threads would stream if nothing else ran on
the cores (a busy machine takes time slices from the wall-clock figures, not from this).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from inference.engine.fused.step_kernels import STRETCH_BYTES  # noqa: E402
from inference.engine.jit.intrinsics import prefetch  # noqa: E402
from inference.engine.quants.formats import GGMLType  # noqa: E402
from inference.engine.quants.intdot import HOST_SIMD, dot_pair_int  # noqa: E402
from inference.engine.quants.kblocks import (  # noqa: E402
    FORMATS,
    STRETCH_LINES_Q4K,
    STRETCH_LINES_Q6K,
    dot_pair_q4k,
    dot_pair_q6k,
    dot_quad_q4k,
    dot_quad_q4k_ahead,
    dot_quad_q6k,
    dot_quad_q6k_ahead,
    super_row_bytes,
)
from inference.engine.quants.nibbles import pack_nibbles  # noqa: E402
from inference.engine.quants.pair_mins import dot_pair_min  # noqa: E402

PREFETCH_BYTES = 3072  # step_kernels.PREFETCH_BYTES: the layout's rows
BLOCKS_PREFETCH_BYTES = 12288  # step_kernels.QUINT_PREFETCH_BYTES: the file blocks' rows


@numba.njit(parallel=True, cache=True)
def stream_layout(q, scales, mins, ints, int_scales, sums, rows, cols, shift, nib, out, passes):
    """out[r] = row r of the int8 (nib < 0) or nibble layout times the activation."""
    groups = cols >> shift
    row_bytes = cols if nib < 0 else cols >> 1
    n_threads = numba.get_num_threads()
    for t in numba.prange(n_threads):
        r0, r1 = rows * t // n_threads // 2 * 2, rows * (t + 1) // n_threads // 2 * 2
        block = np.empty(2, np.float32)
        ahead = max(1, PREFETCH_BYTES // row_bytes) * row_bytes
        for i in range(0, (r1 - r0) * passes, 2):
            r = r0 + i % (r1 - r0)
            start = r * row_bytes
            for j in range(start + ahead, min(start + ahead + 2 * row_bytes, rows * row_bytes), 64):
                prefetch(q, j)
            s0, s1 = r * groups, (r + 1) * groups
            if nib >= 0:
                dot_pair_min(
                    q,
                    start,
                    start + row_bytes,
                    ints,
                    scales,
                    s0,
                    s1,
                    int_scales,
                    mins,
                    s0,
                    s1,
                    sums,
                    groups,
                    shift,
                    nib,
                    block,
                )
            else:
                dot_pair_int(
                    q, start, start + row_bytes, ints, scales, s0, s1, int_scales, groups, shift, block
                )
            out[r], out[r + 1] = block[0], block[1]


@numba.njit(parallel=True, cache=True)
def stream_blocks(q, ints, int_scales, sums, rows, cols, row_bytes, q4k, out, passes):
    """out[r] = row r of the file's super-blocks times the activation."""
    n_threads = numba.get_num_threads()
    for t in numba.prange(n_threads):
        r0, r1 = rows * t // n_threads // 2 * 2, rows * (t + 1) // n_threads // 2 * 2
        block = np.empty(2, np.float32)
        ahead = max(1, BLOCKS_PREFETCH_BYTES // row_bytes) * row_bytes
        for i in range(0, (r1 - r0) * passes, 2):
            r = r0 + i % (r1 - r0)
            start = r * row_bytes
            for j in range(start + ahead, min(start + ahead + 2 * row_bytes, rows * row_bytes), 64):
                prefetch(q, j)
            if q4k:
                dot_pair_q4k(q, start, start + row_bytes, ints, int_scales, sums, cols >> 8, block)
            else:
                dot_pair_q6k(q, start, start + row_bytes, ints, int_scales, sums, cols >> 8, block)
            out[r], out[r + 1] = block[0], block[1]


@numba.njit(parallel=True, cache=True)
def stream_quads(q, ints, int_scales, sums, rows, cols, row_bytes, q4k, out, passes, far=STRETCH_BYTES):
    """stream_blocks four rows a call as step_products.dot_one_row runs a one-row pass: the
    host's quad (two 512-bit pairs sharing the activation's work, or two pairs), prefetching
    the stretch ``far`` bytes ahead inside its loop (kblocks_ir.prefetch_share)."""
    n_threads = numba.get_num_threads()
    stretch = (cols >> 8) * 64 * (STRETCH_LINES_Q4K if q4k else STRETCH_LINES_Q6K)
    last = max(0, q.shape[0] - stretch)
    for t in numba.prange(n_threads):
        r0, r1 = rows * t // n_threads // 4 * 4, rows * (t + 1) // n_threads // 4 * 4
        block = np.empty(4, np.float32)
        reach = max(far, 8 * row_bytes)
        for i in range(0, (r1 - r0) * passes, 4):
            r = r0 + i % (r1 - r0)
            start = r * row_bytes
            at = min(last, start + reach)
            if q4k:
                dot_quad_q4k_ahead(q, start, start + row_bytes, ints, int_scales, sums, cols >> 8, block, at)
            else:
                dot_quad_q6k_ahead(q, start, start + row_bytes, ints, int_scales, sums, cols >> 8, block, at)
            out[r : r + 4] = block


@numba.njit(parallel=True, cache=True)
def stream_quads_burst(q, ints, int_scales, sums, rows, cols, row_bytes, q4k, out, passes):
    """stream_quads as dot_one_row ran before the in-loop prefetch: the quad two units ahead
    prefetched (into L1) in one burst before each call."""
    n_threads = numba.get_num_threads()
    for t in numba.prange(n_threads):
        r0, r1 = rows * t // n_threads // 4 * 4, rows * (t + 1) // n_threads // 4 * 4
        block = np.empty(4, np.float32)
        ahead = max(BLOCKS_PREFETCH_BYTES // row_bytes, 8) * row_bytes
        for i in range(0, (r1 - r0) * passes, 4):
            r = r0 + i % (r1 - r0)
            start = r * row_bytes
            for j in range(start + ahead, min(start + ahead + 4 * row_bytes, rows * row_bytes), 64):
                prefetch(q, j)
            if q4k:
                dot_quad_q4k(q, start, start + row_bytes, ints, int_scales, sums, cols >> 8, block)
            else:
                dot_quad_q6k(q, start, start + row_bytes, ints, int_scales, sums, cols >> 8, block)
            out[r : r + 4] = block


def _file_bytes(qtype: GGMLType, rows: int, cols: int, rng) -> np.ndarray:
    """Random super-blocks with small finite f16 super-scales -> (rows, row bytes) uint8."""
    size = FORMATS[qtype].type_size()
    blocks = rng.integers(0, 256, (rows * cols // 256, size), dtype=np.uint8)  # (blocks, size)
    halves = (0, 2) if qtype == GGMLType.Q4_K else (208,)
    for at in halves:
        values = (rng.random(len(blocks)) * 0.01).astype("<f2")  # (blocks,)
        blocks[:, at : at + 2] = values.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def _runs(qtype: GGMLType, args, rng) -> dict:
    rows, cols = args.rows, args.cols
    data = _file_bytes(qtype, rows, cols, rng)
    lay = FORMATS[qtype].unpack(data.reshape(-1, FORMATS[qtype].type_size()))
    q4k = qtype == GGMLType.Q4_K
    group = 32 if q4k else 16
    q = lay.q.reshape(rows, cols)  # (rows, cols)
    codes = pack_nibbles(q, 0).view(np.int8) if q4k else q  # (rows, cols or cols // 2)
    scales = np.ascontiguousarray(lay.scales.reshape(-1))  # (rows * groups,)
    mins = np.ascontiguousarray(lay.mins.reshape(-1)) if q4k else np.zeros(1, np.float32)
    ints = rng.integers(-127, 128, cols, dtype=np.int8)  # (cols,)
    int_scales = rng.random(cols // group).astype(np.float32)  # (groups,)
    sums = rng.standard_normal(cols // group).astype(np.float32)  # (groups,)
    flat_codes, flat_blocks = codes.ravel(), data.ravel().view(np.int8)
    shift, nib, rb = (5, 0, super_row_bytes(qtype, cols)) if q4k else (4, -1, super_row_bytes(qtype, cols))
    out_a, out_b, out_c = np.empty(rows, np.float32), np.empty(rows, np.float32), np.empty(rows, np.float32)
    name = qtype.name
    quads = {
        f"{name} quads": (
            lambda: stream_quads(
                flat_blocks, ints, int_scales, sums, rows, cols, rb, q4k, out_c, args.passes
            ),
            data.nbytes,
            out_c,
        )
    }
    out_burst = np.empty(rows, np.float32)
    quads[f"{name} quads burst"] = (
        lambda: stream_quads_burst(
            flat_blocks, ints, int_scales, sums, rows, cols, rb, q4k, out_burst, args.passes
        ),
        data.nbytes,
        out_burst,
    )
    for far in args.far:
        out_far = np.empty(rows, np.float32)
        quads[f"{name} quads pf{far}"] = (
            lambda far=far, out_far=out_far: stream_quads(
                flat_blocks, ints, int_scales, sums, rows, cols, rb, q4k, out_far, args.passes, far
            ),
            data.nbytes,
            out_far,
        )
    return {
        f"{name} layout": (
            lambda: stream_layout(
                flat_codes, scales, mins, ints, int_scales, sums, rows, cols, shift, nib, out_a, args.passes
            ),
            codes.nbytes + scales.nbytes + (mins.nbytes if q4k else 0),
            out_a,
        ),
        f"{name} blocks": (
            lambda: stream_blocks(
                flat_blocks, ints, int_scales, sums, rows, cols, rb, q4k, out_b, args.passes
            ),
            data.nbytes,
            out_b,
        ),
    } | quads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10752)
    parser.add_argument("--cols", type=int, default=4864)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--formats", nargs="*", default=["q6_k", "q4_k"])
    parser.add_argument("--far", type=int, nargs="*", default=[], help="also: quads prefetching this far")
    args = parser.parse_args()
    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    runs = {}
    for f in args.formats:
        runs.update(_runs(GGMLType[f.upper()], args, rng))
    for run, _, _ in runs.values():
        run()  # compile and warm
    for name, (_, _, out) in runs.items():
        layout = runs[name.split()[0] + " layout"][2]
        assert np.array_equal(out, layout), f"{name} and the layout gave different bits"
    times, cpu = {name: [] for name in runs}, {name: 0.0 for name in runs}
    for _ in range(args.reps):
        for name, (run, _, _) in runs.items():
            before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpu[name] += after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    load = os.getloadavg()[0]
    print(f"{args.rows}x{args.cols} x{args.passes}, {args.threads} threads, {HOST_SIMD}, load {load:.2f}")
    for name, (_, nbytes, _) in runs.items():
        t, weights = statistics.median(times[name]), args.rows * args.cols * args.passes
        print(
            f"  {name:12s} {nbytes / 1e6:7.1f} MB  median {t * 1e3:6.2f} ms"
            f"  (min {min(times[name]) * 1e3:6.2f})  {weights / t / 1e9:5.1f} Gweights/s"
            f"  {nbytes * args.passes / t / 1e9:5.1f} GB/s"
            f"  ({args.threads * nbytes * args.passes * args.reps / cpu[name] / 1e9:5.1f} a CPU-s x threads)"
        )


if __name__ == "__main__":
    main()
