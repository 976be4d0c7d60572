"""What the memory bus gives a decode step: GB/s that ``threads`` threads read together.

    .venv/bin/python bench/stream.py [--threads 2] [--gib 1] [--reps 5]

Each thread sums its own contiguous share of a buffer far larger than the caches (numpy's
``sum`` over uint64 is bound by memory, not instructions, and releases the GIL), and the
best of ``reps`` runs is reported: load only lowers it. A decode step reads every weight
once, so this is the ceiling its bandwidth is judged against (bench/engine.py prints both).
A numba loop does not serve here: its reduction is bound by instructions (12 GB/s measured
where numpy's read 45).
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np


def stream_gbs(threads: int = 2, gib: float = 1.0, reps: int = 5) -> float:
    """Best GB/s of ``reps`` runs of ``threads`` threads each summing 1/threads of ``gib`` GiB."""
    words = np.ones(int(gib * (1 << 30)) // 8, dtype=np.uint64)  # (words,) touched: no page faults timed
    shares = np.array_split(words, threads)
    best = 0.0
    for _ in range(reps):
        workers = [threading.Thread(target=share.sum) for share in shares]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        best = max(best, words.nbytes / (time.perf_counter() - started) / 1e9)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    one = stream_gbs(1, args.gib, args.reps)
    many = stream_gbs(args.threads, args.gib, args.reps)
    print(f"one thread {one:.1f} GB/s, {args.threads} threads {many:.1f} GB/s")


if __name__ == "__main__":
    main()
