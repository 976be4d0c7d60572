"""Paired A/B of decode steps (or lockstep steps, or prefills) between checkouts, on a machine
other processes share.

    .venv/bin/python bench/decode_ab.py --model PATH [--rounds 20] [--steps 10] [--work decode]
        TREE [TREE ...]

``--work``: ``decode`` (one token after 40 cached), ``batchN`` (one lockstep step of N
conversations, each 40 tokens in: ``Engine.decode_batch``) or ``ppN`` (a prefill of N tokens
into an empty cache). One long-lived worker process per checkout (its own sources and numba
cache) holds the model; the driver asks each in turn for a burst of steps (the same cached
positions each time), alternating the order every round, and starts a burst only when
both cores look idle (/proc/stat over 0.1 s, up to 30 s of waiting): another helper's run that
takes a core halfway through a step makes one thread run the step alone (2x the time), which
no median of unpaired runs separates from a real change. Prints per checkout the median over
rounds of each burst's median step, and its speed against the first checkout paired by round.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

WORKER = "--worker"


CACHED = 40  # tokens in each conversation before a timed decode or lockstep step


def _step(engine, work: str):
    """A function that runs one timed unit of ``work`` (module docstring) when called."""
    from inference.engine.engine import BatchRow

    if work.startswith("pp"):
        prompt = [100 + i % 200 for i in range(int(work[2:]))]
        cache = engine.new_cache(len(prompt) + 8)

        def prefill():
            cache.truncate(0)
            engine.prefill(cache, prompt)

        return prefill
    width = int(work[5:]) if work.startswith("batch") else 1
    caches = [engine.new_cache(2048) for _ in range(width)]
    for n, cache in enumerate(caches):
        engine.prefill(cache, [100 + n + i for i in range(CACHED)])

    def step():
        for cache in caches:
            cache.truncate(CACHED)
        if width == 1:
            engine.decode_one(caches[0], 7)
        else:
            engine.decode_batch([BatchRow(cache, 7 + n) for n, cache in enumerate(caches)])

    return step


def _worker(model: str, work: str) -> None:
    sys.path.insert(0, ".")  # the checkout the worker runs in
    from inference.engine.engine import Engine

    engine = Engine.load(model)
    step = _step(engine, work)
    for _ in range(5):
        step()
    print("ready", flush=True)
    for line in sys.stdin:
        times = []
        for _ in range(int(line)):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        print(" ".join(f"{t * 1e3:.4f}" for t in times), flush=True)


def _idle_fraction(seconds: float = 0.1) -> float:
    def snapshot():
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return values[3] + values[4], sum(values)

    idle0, total0 = snapshot()
    time.sleep(seconds)
    idle1, total1 = snapshot()
    return (idle1 - idle0) / max(1, total1 - total0)


def _wait_quiet(limit: int = 300) -> None:
    for _ in range(limit):
        if _idle_fraction() > 0.93:
            return


def main() -> None:
    if len(sys.argv) > 3 and sys.argv[1] == WORKER:
        _worker(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--work", default="decode", help="decode, batchN or ppN (module docstring)")
    parser.add_argument("trees", nargs="+", type=Path)
    args = parser.parse_args()
    if not re.fullmatch(r"decode|batch[1-9][0-9]*|pp[1-9][0-9]*", args.work):
        parser.error(f"--work {args.work!r}: expected decode, batchN or ppN")
    script = Path(__file__).resolve()
    workers = [
        subprocess.Popen(
            [str(tree / ".venv/bin/python"), str(script), WORKER, args.model, args.work],
            cwd=tree,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for tree in args.trees
    ]
    for worker in workers:
        assert worker.stdout.readline().strip() == "ready", "a worker failed to load the model"
    medians = [[] for _ in workers]  # (trees, rounds) ms
    for r in range(args.rounds):
        order = list(range(len(workers)))
        for i in order if r % 2 == 0 else order[::-1]:
            _wait_quiet()
            workers[i].stdin.write(f"{args.steps}\n")
            workers[i].stdin.flush()
            medians[i].append(float(np.median([float(v) for v in workers[i].stdout.readline().split()])))
    for worker in workers:
        worker.stdin.close()
        worker.wait()
    for tree, runs in zip(args.trees, medians, strict=True):
        paired = statistics.median(b / m for b, m in zip(medians[0], runs, strict=True))
        print(f"{tree}: median step {statistics.median(runs):.3f} ms, {paired:.3f}x the first (paired)")


if __name__ == "__main__":
    main()
