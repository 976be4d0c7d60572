"""Long-prompt prefill, ours against llama.cpp: N tokens into an empty cache of --ctx rows.

    .venv/bin/python bench/long_prompt.py [--model PATH] [--sizes 8192,27129] [--ctx 32768]
        [--prompt code|random] [--llama-python LLAMA_VENV/bin/python] [--threads 2] [--reps 1]

The cost that grows with a long prompt is attention over the cache (every row reads all the
rows before it), so this is where tiled attention shows or does not. Our side is
Engine.prefill (the serving path's 256-token chunks); llama.cpp's runs in
bench/llama_worker.py with the server's defaults (n_batch 2048, n_ubatch 512, f16 KV cache,
no flash attention unless --flash-attn), the same token ids and thread count. Ours and
llama.cpp alternate per size so both see the same machine load; the load average before and
after each run is printed (the machine is shared: an 8k run takes minutes).

The prompt (``--prompt code``, the default) is a coding agent's kind of first request, as in
issue 15's case (Claude Code, 27,129 tokens): a chat-templated system message made of this
repository's docs, then a user message of its source files (docs/*.md, then inference/**/*.py,
sorted, each under a ``# file:`` header), tokenized by the model's tokenizer; a size of N
takes its first N tokens. ``--prompt random`` gives uniform random ids (the first runs').
The prompt follows the repository's files (an edit to a doc changes it), so the token count
and a digest of the ids are printed: equal digests, equal prompts.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # before numpy: idle BLAS threads spin otherwise

import argparse
import datetime
import hashlib
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

USER_ENV = dict(os.environ)  # llama.cpp's environment: before the engine sets its OpenMP default
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from inference.engine.engine import Engine  # noqa: E402

DEFAULT_MODEL = ROOT / "models/qwen2.5-coder-0.5b-instruct.gguf"
SERVER_N_BATCH, SERVER_N_UBATCH = 2048, 512  # llama-server's defaults


class Ours:
    def __init__(self, path: Path, n_ctx: int):
        self.engine = Engine.load(path)
        self.cache = self.engine.new_cache(n_ctx)

    def prefill(self, tokens: list[int]) -> tuple[float, float]:
        """(wall seconds, CPU seconds of all threads) of one prefill into the empty cache."""
        self.cache.truncate(0)
        t0, cpu = time.perf_counter(), time.process_time()
        self.engine.prefill(self.cache, tokens)
        return time.perf_counter() - t0, time.process_time() - cpu


class Llama:
    """llama.cpp in a worker process (bench/llama_worker.py's protocol)."""

    def __init__(self, python: str, path: Path, n_ctx: int, threads: int, flash_attn: bool):
        worker = str(ROOT / "bench" / "llama_worker.py")
        self.proc = subprocess.Popen(
            [python, worker],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            env=USER_ENV,
        )
        self.ask(
            op="load",
            model=str(path),
            threads=threads,
            n_ctx=n_ctx,
            n_batch=SERVER_N_BATCH,
            n_ubatch=SERVER_N_UBATCH,
            flash_attn=flash_attn,
        )

    def ask(self, **request) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("llama.cpp worker exited")
        return json.loads(line)

    def prefill(self, tokens: list[int]) -> tuple[float, float]:
        answer = self.ask(op="prefill", tokens=tokens)
        return answer["seconds"], answer["cpu_seconds"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def code_prompt(engine: Engine, n_tokens: int) -> list[int]:
    """At least n_tokens token ids of a coding agent's request built from this repository's
    docs (system) and source files (user), in the model's chat format."""
    docs = sorted((ROOT / "docs").glob("*.md"))
    sources = sorted((ROOT / "inference").rglob("*.py"))
    system = "\n\n".join(path.read_text() for path in docs)
    user = "".join(f"# file: {path.relative_to(ROOT)}\n{path.read_text()}\n" for path in sources)
    text = (
        f"<|im_start|>system\nYou are a coding agent working in this repository.\n{system}<|im_end|>\n"
        f"<|im_start|>user\nHere is the source:\n{user}\nFind the bug.<|im_end|>\n<|im_start|>assistant\n"
    )
    tokens = engine.tokenizer.encode(text)
    if len(tokens) < n_tokens:
        raise SystemExit(f"the repository gives {len(tokens)} tokens, fewer than {n_tokens}")
    return tokens


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def run(runners: dict, tokens: list[int], sizes: list[int], reps: int) -> list[str]:
    """Table rows: per size, each runner's best wall tok/s over ``reps``, the CPU seconds of that
    run (all threads: the load shows as wall >> CPU / threads) and the load average around it."""
    for runner in runners.values():  # compile, page the weights in
        runner.prefill(tokens[:16])
    lines = []
    for n in sizes:
        best: dict[str, tuple[float, float]] = {}
        loads = [_load()]
        for _ in range(reps):
            for name, runner in runners.items():
                wall, cpu = runner.prefill(tokens[:n])
                if name not in best or wall < best[name][0]:
                    best[name] = (wall, cpu)
                loads.append(_load())
                print(f"  {name} pp{n}: {wall:.1f} s wall, {cpu:.1f} s CPU, load {loads[-1]}", flush=True)
        ours, theirs = best["ours"], best.get("llama.cpp")
        cells = [f"pp{n}", f"{n / ours[0]:.1f}", f"{ours[1]:.0f} s"]
        if theirs:
            cells += [f"{n / theirs[0]:.1f}", f"{theirs[1]:.0f} s", f"{theirs[0] / ours[0]:.2f}x"]
            cells.append(f"{theirs[1] / ours[1]:.2f}x")
        else:
            cells += ["-"] * 4
        lines.append("| " + " | ".join(cells + [" -> ".join(loads)]) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--sizes", default="8192,27129", help="comma-separated prompt lengths")
    parser.add_argument("--prompt", choices=("code", "random"), default="code")
    parser.add_argument("--ctx", type=int, default=32768)
    parser.add_argument("--llama-python", help="interpreter where llama_cpp imports")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--flash-attn", action="store_true", help="llama.cpp with flash attention")
    args = parser.parse_args()
    import numba

    numba.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    runners: dict = {"ours": Ours(args.model, args.ctx)}
    if args.prompt == "code":
        tokens = code_prompt(runners["ours"].engine, max(sizes))
    else:
        vocab = runners["ours"].engine.config.vocab_size
        tokens = [int(t) for t in np.random.default_rng(0).integers(100, min(vocab, 20000), max(sizes))]
    digest = hashlib.sha256(json.dumps(tokens[: max(sizes)]).encode()).hexdigest()[:12]
    if args.llama_python:
        runners["llama.cpp"] = Llama(args.llama_python, args.model, args.ctx, args.threads, args.flash_attn)
    print(
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
        f"{os.cpu_count()} cpus, {args.threads} threads, {args.model.name}, --ctx {args.ctx}, "
        f"best of {args.reps}, llama.cpp n_batch {SERVER_N_BATCH} n_ubatch {SERVER_N_UBATCH} "
        f"flash_attn {args.flash_attn}, prompt {args.prompt} ({len(tokens)} tokens available, "
        f"ids of the longest size sha256 {digest})",
        flush=True,
    )
    try:
        rows = run(runners, tokens, sizes, args.reps)
    finally:
        if "llama.cpp" in runners:
            runners["llama.cpp"].close()
    print(
        "\n| prompt | ours tok/s | ours CPU | llama.cpp tok/s | llama.cpp CPU | ours / llama.cpp (wall) "
        "| (CPU) | load average (1/5/15 min) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
