"""CPU time per decoded token, ours or llama.cpp's: a figure a loaded machine inflates less than wall time.

    .venv/bin/python bench/decode_cpu.py MODEL [--threads 1]            # ours: whole step and
                                                                        # the step without its head
    LLAMA_VENV/bin/python bench/decode_cpu.py MODEL --llama [--threads 1]

Both prefill the same 32 tokens, then time one-token steps with ``time.process_time`` (every
thread of the process) and ``perf_counter``; medians after a few warm-up steps. Ours times the
fused forward itself and ``FusedForward.residual`` (the same kernel without head rows), so the
difference is the output head's share. Run ours and llama.cpp's alternately in the same minutes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = list(range(100, 132))
TOKEN = 7
WARMUP = 4


def _timed(step, steps: int) -> tuple[float, float]:
    """(median wall, median CPU) seconds of ``step()`` over ``steps`` calls after warm-up."""
    walls, cpus = [], []
    for i in range(steps + WARMUP):
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        if i >= WARMUP:
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus)


def ours(path: str, threads: int, steps: int) -> None:
    import numba
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from inference.engine.engine import Engine
    from inference.engine.models.base import Run

    numba.set_num_threads(threads)
    engine = Engine.load(path)
    model = engine.model
    cache = engine.new_cache(2048)
    engine.prefill(cache, PROMPT)
    x = model.embed(np.array([TOKEN], np.int64))  # (1, n_embd)
    plan = model.row_plan([Run(cache, [TOKEN])])  # the next position, never committed
    for name, step in (
        ("whole step", lambda: model.fused(x, plan)),
        ("no head", lambda: model.fused.residual(x, plan)),
    ):
        wall, cpu = _timed(step, steps)
        print(
            f"ours {Path(path).name} {threads} threads, {name}: "
            f"wall {wall * 1e3:.2f} ms, CPU {cpu * 1e3:.2f} ms"
        )


def llama(path: str, threads: int, steps: int) -> None:
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=path, n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False
    )
    llm.eval(PROMPT)
    wall, cpu = _timed(lambda: llm.eval([TOKEN]), steps)
    print(f"llama.cpp {Path(path).name} {threads} threads: wall {wall * 1e3:.2f} ms, CPU {cpu * 1e3:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--llama", action="store_true", help="time llama.cpp (llama_cpp must import)")
    args = parser.parse_args()
    (llama if args.llama else ours)(args.model, args.threads, args.steps)


if __name__ == "__main__":
    main()
