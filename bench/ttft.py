"""Time to first token, cold vs warm, on a ~1800-token system prompt shared by two conversations.

    .venv/bin/python bench/ttft.py [--model PATH] [--rounds 3] [--words 1300]

Starts ``manage.py lmserve`` (two KV slots, --ctx 4096) on a free port. Each round draws a
fresh system prompt (so nothing is cached), sends conversation A (cold: a full prefill), then
conversation B with the same system prompt and another question (warm: the shared prefix is
copied from A's slot), and times each streamed request from sending to the first content
delta. Medians and the cold / warm ratio are printed, with the cached_tokens of B, and the
server's first request (round 0's A) against the later rounds' A.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.api.test_kv_slots import long_system_prompt  # noqa: E402  (the same prompt the tests use)


def start_server(model: str | None, log: Path) -> tuple[subprocess.Popen, str]:
    args = [sys.executable, "manage.py", "lmserve", "--port", "0", "--kv-slots", "2", "--ctx", "4096"]
    if model:
        args.insert(3, model)
    process = subprocess.Popen(args, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith("lmserve: serving"):
                url = line.split()[-1].rstrip("/")
                try:
                    if httpx.get(url + "/health", timeout=5).status_code == 200:
                        return process, url
                except httpx.TransportError:
                    pass
        if process.poll() is not None:
            raise RuntimeError(log.read_text())
        time.sleep(0.1)
    process.kill()
    raise TimeoutError(log.read_text())


def timed_request(http: httpx.Client, system: str, question: str) -> tuple[float, int, int]:
    """Seconds to the first content delta, prompt tokens and cached tokens."""
    body = {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 8,
        "temperature": 0,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }
    t0 = time.perf_counter()
    first, usage = None, None
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter() - t0
            usage = chunk.get("usage") or usage
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return (first if first is not None else time.perf_counter() - t0), usage["prompt_tokens"], cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: the server's default model)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--words", type=int, default=1550, help="system prompt length in words")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        process, url = start_server(args.model, Path(tmp) / "server.log")
        try:
            cold, warm = [], []
            with httpx.Client(base_url=url, timeout=600) as http:
                for round_ in range(args.rounds):
                    system = long_system_prompt(args.words, seed=1000 + round_)
                    t_cold, prompt_a, _ = timed_request(http, system, "Summarize the notes.")
                    t_warm, prompt_b, cached_b = timed_request(http, system, "Which word is most common?")
                    cold.append(t_cold)
                    warm.append(t_warm)
                    print(
                        f"round {round_}: cold {t_cold:.2f} s ({prompt_a} tokens), "
                        f"warm {t_warm:.2f} s ({cached_b}/{prompt_b} cached)"
                    )
        finally:
            process.terminate()
            process.wait(60)
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"median TTFT: cold {c:.2f} s, warm {w:.2f} s, ratio {c / w:.1f}x")
    if len(cold) > 1:  # round 0 is the server's first request: it should cost no more than later ones
        later = statistics.median(cold[1:])
        ratio = cold[0] / later
        print(f"the server's first request: {cold[0]:.2f} s, later cold ones {later:.2f} s ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
