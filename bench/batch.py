"""Lockstep batches: aggregate decode speed of concurrent requests, ``--batch N`` against
``--batch 1`` (docs/BENCHMARKS.md).

    .venv/bin/python bench/batch.py [--model PATH ...] [--batch 4] [--tokens 64] [--rounds 3]

For each model, two ``manage.py lmserve`` servers are started in turn (``--batch 1``, then
``--batch N``; both with N + 1 KV slots). Each round sends N greedy requests of exactly
``--tokens`` tokens (``ignore_eos``), different prompts, two ways:

- queued: the N requests wait behind busy streams (as many as the server's ``--batch``, since
  requests join a running batch up to its width), which then hang up, so the worker takes
  all of them within a step or two (what a loaded server sees); timed from the hang-up to the
  last reply.
- burst: the N requests are fired at once at an idle server (the worker starts the first
  alone, since it never waits for a batch to fill, and the rest join it between steps); timed
  from the first send to the last reply.

The aggregate rate is N x tokens over that time; the median over the rounds after a warm-up
round is reported (prompts repeat across rounds, so later rounds find them cached and time
the decode). Also printed: the machine's load average, since a shared machine skews both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.api.conftest import start_lmserve  # noqa: E402  (the tests' server launcher)
from tests.api.rawhttp import RawRequest, count_frames  # noqa: E402

TOPICS = ("the sea", "a mountain village", "an old clock", "the first snow", "a lighthouse", "a library")


def bodies(n: int, tokens: int) -> list[dict]:
    return [
        {
            "messages": [{"role": "user", "content": f"Write a long story about {TOPICS[i % len(TOPICS)]}."}],
            "max_tokens": tokens,
            "ignore_eos": True,
            "temperature": 0,
        }
        for i in range(n)
    ]


def post_all(url: str, requests: list[dict]) -> tuple[list[threading.Thread], list]:
    replies: list = [None] * len(requests)

    def post(i: int) -> None:
        replies[i] = httpx.post(url + "/v1/chat/completions", json=requests[i], timeout=1800)
        replies[i].raise_for_status()
        replies[i] = time.perf_counter()

    threads = [threading.Thread(target=post, args=(i,)) for i in range(len(requests))]
    return threads, replies


def queued_round(server, requests: list[dict], batch: int) -> float:
    """Seconds from the blockers' hang-up to the last reply, the requests queued behind them."""
    busy = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4000}
    busy.update(stream=True, ignore_eos=True)
    blockers = []
    for _ in range(batch):  # a full batch: nothing joins it
        blockers.append(RawRequest(server.url, "/v1/chat/completions", busy))
        blockers[-1].read_until(lambda got: count_frames(got) >= 1)
    threads, done = post_all(server.url, requests)
    for i, thread in enumerate(threads):
        thread.start()
        server.wait_until(lambda h, n=i + 1: h["queued"] == n, timeout=600)
    start = time.perf_counter()
    for blocker in blockers:
        blocker.close()
    for thread in threads:
        thread.join()
    return max(done) - start


def burst_round(server, requests: list[dict], batch: int) -> float:
    """Seconds from firing every request at an idle server to the last reply."""
    server.wait_idle(timeout=600)
    threads, done = post_all(server.url, requests)
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return max(done) - start


def measure(model: str, batch: int, width: int, tokens: int, rounds: int) -> dict[str, float]:
    """Median aggregate tok/s per mode for one server."""
    flags = ["--batch", str(batch), "--kv-slots", str(width + 1), "--queue", str(2 * width), "--ctx", "1024"]
    with tempfile.TemporaryDirectory() as logs:
        server = start_lmserve(Path(logs), *([model] if model else []), *flags)
        try:
            requests = bodies(width, tokens)
            rates: dict[str, list[float]] = {"queued": [], "burst": []}
            for r in range(rounds + 1):
                for mode, run in (("queued", queued_round), ("burst", burst_round)):
                    seconds = run(server, requests, batch)
                    if r:  # round 0 warms up and caches the prompts
                        rates[mode].append(width * tokens / seconds)
            return {mode: statistics.median(values) for mode, values in rates.items()}
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", action="append", help="GGUF path (repeatable; default: the bundled SmolLM2)"
    )
    parser.add_argument("--batch", type=int, default=4, help="concurrent requests and --batch N (default 4)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per request (default 64)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-up (default 3)")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    print(f"| model | mode | --batch 1 tok/s | --batch {args.batch} tok/s | speed-up |")
    print("|---|---|---|---|---|")
    for model in args.model or [""]:
        plain = measure(model, 1, args.batch, args.tokens, args.rounds)
        batched = measure(model, args.batch, args.batch, args.tokens, args.rounds)
        name = Path(model).name if model else "SmolLM2-135M-Instruct.Q4_1.gguf"
        for mode in ("queued", "burst"):
            ratio = batched[mode] / plain[mode]
            print(f"| {name} | {mode} | {plain[mode]:.1f} | {batched[mode]:.1f} | {ratio:.2f}x |", flush=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
