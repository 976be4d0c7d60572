"""Speculative decoding against plain decoding, on retrieval-shaped replies and open prose.

    .venv/bin/python bench/spec.py [--models smollm2 qwen2.5] [--tasks list code doc prose]
                                   [--max-tokens 96] [--reps 2]

For each model: measure the verify costs (as ``lmserve --spec`` does at warm-up), then for each
task run the decode loop plainly and with the speculator on the same chat prompt (greedy),
alternating, ``--reps`` times each, and keep the best decode time of each (the machine is
shared: the best run is the least disturbed). The two replies must be identical token for
token. Prints decode tok/s of both, the speed-up, and accepted/drafted tokens.

Tasks: ``list`` (repeat a list), ``code`` (edit a function and write it out again), ``doc``
(answer from a document by quoting it) are retrieval-shaped: the reply copies spans of the
prompt. ``prose`` (a story) has nothing to copy: the cost gate should keep it near 1.0x.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from inference.engine.engine import Engine  # noqa: E402
from inference.engine.sampler import SamplingParams  # noqa: E402
from inference.generation.speculative import Speculator  # noqa: E402
from inference.generation.stream import GenerationStats  # noqa: E402
from inference.generation.tokens import TokenGenerator  # noqa: E402
from inference.model_files import resolve_model  # noqa: E402

MODELS = {"smollm2": "", "qwen2.5": "models/qwen2.5-coder-0.5b-instruct.gguf"}
ITEMS = (
    "hammer, wrench, pliers, screwdriver, chisel, saw, drill, level, tape measure, utility knife, "
    "clamp, file, mallet, crowbar, sander, stapler, square, plane, awl, vise"
)
CODE = """def summarize(orders):
    count = 0
    amount = 0.0
    for order in orders:
        if order.status == "paid":
            count += 1
            amount += order.price * order.quantity
    average = amount / count if count else 0.0
    return {"count": count, "amount": amount, "average": average}
"""
DOCUMENT = (
    "The Harbor Bridge was designed by the engineer Marta Lindqvist and built between 1931 and 1936. "
    "It spans 503 metres across the river mouth and carries two railway tracks and six road lanes. "
    "The bridge opened to traffic on the 14th of March 1936, after a ceremony attended by 40,000 people. "
    "Its steel arch was painted grey until 1988, when the city chose the present dark red colour. "
    "Maintenance crews repaint one section every year, so the whole arch is repainted every 12 years."
)
TASKS = {
    "list": f"Repeat this list of tools exactly, in the same order: {ITEMS}.",
    "code": f"Rename the variable `amount` to `total` in this Python function and write out the whole "
    f"function:\n\n{CODE}",
    "doc": f"Document:\n{DOCUMENT}\n\nQuote, word for word, the sentence of the document that says when the "
    "bridge opened and how many people attended, then the sentence about its colour.",
    "prose": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def decode_run(
    generator: TokenGenerator, prompt: list[int], max_tokens: int
) -> tuple[list[int], float, GenerationStats]:
    """The reply and the seconds from the end of prefill to the last token."""
    cache = generator.engine.new_cache(len(prompt) + max_tokens + 1)
    t0 = time.perf_counter()
    run = generator.run(cache, prompt, SamplingParams(), max_tokens)
    return run.tokens, time.perf_counter() - t0 - run.stats.prefill_seconds, run.stats


def bench_model(name: str, tasks: list[str], max_tokens: int, reps: int) -> None:
    engine = Engine.load(resolve_model(MODELS[name]))
    speculator = Speculator(engine)
    print(f"## {engine.model_id}: verify cost per row count (decode steps) {speculator.measure().describe()}")
    plain_loop, spec_loop = TokenGenerator(engine), TokenGenerator(engine, speculator)
    print(
        f"{'task':6} {'tokens':>6} {'plain tok/s':>11} {'spec tok/s':>10} {'speed-up':>8}  accepted/drafted"
    )
    for task in tasks:
        text = TASKS[task]
        prompt = engine.encode_chat([{"role": "user", "content": text}])
        best_plain = best_spec = float("inf")
        for _ in range(reps):
            plain, seconds, _ = decode_run(plain_loop, prompt, max_tokens)
            best_plain = min(best_plain, seconds)
            spec, seconds, stats = decode_run(spec_loop, prompt, max_tokens)
            best_spec = min(best_spec, seconds)
            if spec != plain:
                raise SystemExit(f"{task}: the speculative reply differs from the plain one")
        n = len(plain)
        print(
            f"{task:6} {n:6d} {n / best_plain:11.1f} {n / best_spec:10.1f} {best_plain / best_spec:7.2f}x"
            f"  {stats.spec_accepted}/{stats.spec_drafted}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    for name in args.models:
        bench_model(name, args.tasks, args.max_tokens, args.reps)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
