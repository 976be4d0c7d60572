"""``--experts=repack`` against ``--experts=borrow`` on MoE files: load time, resident memory
and decode speed, each mode in a fresh interpreter (so RSS is that mode's own).

    .venv/bin/python bench/experts.py [--model PATH ...] [--tokens 32] [--cache 16]

Without ``--model`` it writes the synthetic MoE test files (gemma4-moe, qwen3moe, qwen35moe,
inkling) plus ``qwen3moe-wide``, a qwen3moe of 64 experts (k=8) x 4 layers whose expert
tensors dominate the file as they do in released MoE models. The numba kernels are compiled
by a first untimed run. RSS is VmRSS of /proc/self/status (MiB) after load and after decode.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WIDE = {"expert_count": 64, "expert_used_count": 8, "expert_feed_forward_length": 512}


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def synthetic_files(directory: Path) -> dict[str, Path]:
    """The test suite's synthetic MoE files and the wide qwen3moe, written into directory."""
    from tests.fixtures import synthetic_gguf
    from tests.fixtures.synthetic_gemma4 import gemma4_path
    from tests.fixtures.synthetic_inkling import inkling_path
    from tests.fixtures.synthetic_qwen35 import qwen35_path

    files = {
        "gemma4-moe": gemma4_path("gemma4-moe", directory),
        "qwen3moe": synthetic_gguf.synthetic_path("qwen3moe", directory),
        "qwen35moe": qwen35_path("qwen35moe", directory),
        "inkling": inkling_path("inkling", directory),
    }
    wide = directory / "qwen3moe-wide.gguf"
    if not wide.exists():
        spec = replace(synthetic_gguf.SPECS["qwen3moe"], n_layers=4, extra_keys=WIDE)
        synthetic_gguf.write_spec(spec, wide)
    files["qwen3moe-wide"] = wide
    return files


def measure(path: str, mode: str, cache: int, n_tokens: int) -> dict:
    """One mode on one file, in this process: load, prefill 16 tokens, decode n_tokens."""
    import numpy as np

    from inference.engine.engine import Engine
    from inference.engine.load_options import ExpertMode, LoadOptions

    before = rss_mib()
    t0 = time.perf_counter()
    engine = Engine.load(path, LoadOptions(experts=ExpertMode(mode), expert_cache=cache))
    load_s = time.perf_counter() - t0
    loaded = rss_mib()
    cache_kv = engine.new_cache(16 + n_tokens + 1)
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, engine.config.vocab_size, 16)]
    token = int(np.argmax(engine.prefill(cache_kv, prompt)))
    t0 = time.perf_counter()
    for _ in range(n_tokens):
        token = int(np.argmax(engine.decode_one(cache_kv, token)))
    decode_s = time.perf_counter() - t0
    return dict(
        load_s=round(load_s, 3),
        rss_load_mib=round(loaded - before, 1),
        rss_after_mib=round(rss_mib() - before, 1),
        decode_tok_s=round(n_tokens / decode_s, 1),
    )


def run_child(path: Path, mode: str, cache: int, n_tokens: int) -> dict:
    args = [sys.executable, __file__, "--child", str(path), mode, str(cache), str(n_tokens)]
    done = subprocess.run(args, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=None, help="a MoE GGUF (repeatable)")
    parser.add_argument("--tokens", type=int, default=32, help="decode steps timed (default 32)")
    parser.add_argument("--cache", type=int, default=16, help="borrow: experts kept per tensor")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        path, mode, cache, n_tokens = opts.child
        print(json.dumps(measure(path, mode, int(cache), int(n_tokens))))
        return
    directory = Path(tempfile.mkdtemp(prefix="experts-bench-"))
    files = {Path(p).stem: Path(p) for p in opts.model} if opts.model else synthetic_files(directory)
    for name, path in files.items():
        run_child(path, "repack", opts.cache, 2)  # compiles the kernels the file needs
        mib = path.stat().st_size / 2**20
        for mode, cache in (("repack", opts.cache), ("borrow", opts.cache), ("borrow", 1)):
            row = run_child(path, mode, cache, opts.tokens)
            print(f"{name:14s} {mib:7.1f} MiB {mode:6s} cache={cache:<3d} {json.dumps(row)}", flush=True)


if __name__ == "__main__":
    main()
