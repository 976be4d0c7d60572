"""Speed and memory at scale: bench/memory.py and bench/engine.py on models larger than ours.

    .venv/bin/python bench/scale.py [--models tinyllama,llama3-8b] [--llama-python LLAMA_VENV/bin/python]
        [--reps 3] [--ctx 2048] [--dir ~/.cache/lmserve/bench-scale] [--only-write]

Our three real models are 135M-500M parameters, so they cannot show whether the engine holds
its weights near the file's size, and keeps up with llama.cpp, when a file is gigabytes. This
script writes two random-weight GGUF files with the test suite's writer
(tests/fixtures/synthetic_gguf.py), with the shapes of larger models and a Q4_K_M-like mix
(Q4_K matrices, Q6_K attn_v, ffn_down and output):

- ``tinyllama``: TinyLlama-1.1B's shape, 22 layers of n_embd 2048, n_ff 5632, 32 heads, 4 KV
  heads of 64 (~0.7 GB);
- ``llama3-8b``: Llama-3-8B's shape, 32 layers of n_embd 4096, n_ff 14336, 32 heads, 8 KV
  heads of 128 (~4.7 GB).

The tokenizer is SmolLM2's (the writer copies it from the bundled model), so the vocabulary,
and with it the embedding table and the output head, is SmolLM2's 49152 rows, not Llama 3's
128256 (nor TinyLlama's 32000): the files are ~0.75 and ~4.7 GB where real Q4_K_M files of
these models are ~0.67 and ~4.9 GB. The values are random, so only speed and memory mean
anything, never the text.

Each file is written once (atomically, under a name with the generator's version) into
``--dir``, outside the repository, so the files never reach git; later runs reuse them. The
writer holds every tensor in memory (~5 GB for the 8B shape), so it runs in a child process
whose memory is returned before anything is measured.

For each model, the existing scripts run as subprocesses and their tables are printed under
one heading per model: bench/memory.py (peak RSS at load, RSS after a short decode and its
anonymous part, our RSS over the file's size, load time; ours / llama.cpp) and then
bench/engine.py --no-startup --tests pp256,tg64 (prefill and decode tok/s side by side with
llama.cpp, and decode bandwidth as a share of what the bus streams). memory.py's figures
include numba's compilation when its cache is cold (a fresh checkout): run the engine once
first. ``--layers N`` (a dev option) writes and measures an N-layer file of the same shape
instead, to try the pipeline cheaply.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402

from tests.fixtures.synthetic_gguf import (  # noqa: E402
    GENERATOR_VERSION,
    SPECS,
    SyntheticSpec,
    matrix_shapes,
    spec_tensor_types,
    write_spec,
    written_once,
)

DEFAULT_DIR = Path("~/.cache/lmserve/bench-scale")
VOCAB = SPECS["llama"].extra_keys["vocab_size"]  # SmolLM2's: the tokenizer the writer copies
ENGINE_TESTS = "pp256,tg64"
GIB = 1024**3

# Q4_K_M-like: llama.cpp's Q4_K_M gives attn_v and ffn_down Q6_K in some layers only, these
# files in every layer (a few percent more bytes, and the same two kernels in every layer).
Q4_K_M_LIKE = dict(
    attn_q=Q.Q4_K,
    attn_k=Q.Q4_K,
    attn_v=Q.Q6_K,
    attn_output=Q.Q4_K,
    ffn_gate=Q.Q4_K,
    ffn_up=Q.Q4_K,
    ffn_down=Q.Q6_K,
)


@dataclass(frozen=True)
class ScaleModel:
    """One synthetic file of a larger model's shape: ``--models`` name, file stem and spec."""

    name: str
    stem: str
    spec: SyntheticSpec

    def path(self, directory: Path) -> Path:
        """Where the file lives in ``directory``; the version keeps a changed generator's
        bytes from being mistaken for the old ones."""
        trial = self.spec.n_layers != MODELS[self.name].spec.n_layers
        layers = f"-{self.spec.n_layers}layers" if trial else ""
        return directory / f"synthetic-{self.stem}{layers}-v{GENERATOR_VERSION}.gguf"

    def with_layers(self, n_layers: int | None) -> ScaleModel:
        """This model with ``n_layers`` layers (None: as it is), for a cheap trial run."""
        if n_layers is None or n_layers == self.spec.n_layers:
            return self
        return replace(self, spec=replace(self.spec, n_layers=n_layers))


def llama_shape(
    *,
    n_layers: int,
    n_embd: int,
    n_ff: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    rope_base: float,
    context_length: int,
) -> SyntheticSpec:
    """The test suite's llama spec at another shape, with the Q4_K_M-like mix and an untied head."""
    base = SPECS["llama"]
    return replace(
        base,
        n_layers=n_layers,
        n_embd=n_embd,
        n_ff=n_ff,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        rope_base=rope_base,
        context_length=context_length,
        token_embd=Q.Q4_K,
        output=Q.Q6_K,
        layer_types=(Q4_K_M_LIKE,),
        extra_keys={**base.extra_keys, "rope.dimension_count": head_dim},
    )


MODELS = {
    "tinyllama": ScaleModel(
        "tinyllama",
        "tinyllama-1.1b-shape",
        llama_shape(
            n_layers=22,
            n_embd=2048,
            n_ff=5632,
            n_heads=32,
            n_kv_heads=4,
            head_dim=64,
            rope_base=10000.0,
            context_length=2048,
        ),
    ),
    "llama3-8b": ScaleModel(
        "llama3-8b",
        "llama3-8b-shape",
        llama_shape(
            n_layers=32,
            n_embd=4096,
            n_ff=14336,
            n_heads=32,
            n_kv_heads=8,
            head_dim=128,
            rope_base=500000.0,
            context_length=8192,
        ),
    ),
}


def tensor_bytes(spec: SyntheticSpec) -> int:
    """Bytes of the file's tensor data (not its metadata), from the spec alone: the size to
    expect before a write of minutes starts."""
    shapes = matrix_shapes(spec)
    total = 0
    for name, qtype in spec_tensor_types(spec).items():
        role = name.split(".")[-2]
        if name in ("token_embd.weight", "output.weight"):
            shape = (VOCAB, spec.n_embd)
        elif role in shapes:
            shape = shapes[role]
        else:  # norms: one row of n_embd (llama has no per-head norms)
            shape = (spec.n_embd,)
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        total += math.prod(shape) // block * type_size
    return total


def write(model: ScaleModel, directory: Path) -> Path:
    """``model``'s file in ``directory``, written now unless it is there already."""
    path = model.path(directory)
    if path.exists():
        print(f"{path.name}: present ({path.stat().st_size / GIB:.2f} GiB)", flush=True)
        return path
    spec = model.spec
    print(f"{path.name}: writing ~{tensor_bytes(spec) / GIB:.2f} GiB, {spec.n_layers} layers", flush=True)
    t0 = time.perf_counter()

    def on_layer(i: int) -> None:
        if (i + 1) % 4 == 0 or i + 1 == spec.n_layers:
            print(f"  layer {i + 1}/{spec.n_layers} made ({time.perf_counter() - t0:.0f} s)", flush=True)

    written_once(path, lambda partial: write_spec(spec, partial, on_layer=on_layer))
    print(f"  written in {time.perf_counter() - t0:.0f} s: {path.stat().st_size / GIB:.2f} GiB", flush=True)
    return path


def write_in_child(args: argparse.Namespace) -> None:
    """Write the missing files in a fresh interpreter of this script: its ~5 GB of tensors
    leave with it, instead of lingering in this process's heap while the benchmarks run."""
    command = [sys.executable, __file__, "--only-write", "--dir", str(args.dir), "--models", args.models]
    if args.layers is not None:
        command += ["--layers", str(args.layers)]
    subprocess.run(command, check=True)


def run_bench(script: str, path: Path, extra: list[str]) -> bool:
    """Run bench/``script`` on ``path``, its output straight to ours; True when it succeeded."""
    command = [sys.executable, str(ROOT / "bench" / script), "--model", str(path), *extra]
    print(f"$ {' '.join(command)}", flush=True)
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        print(f"bench/{script} failed (exit {done.returncode})", flush=True)
    return done.returncode == 0


def measure(model: ScaleModel, path: Path, args: argparse.Namespace) -> bool:
    """bench/memory.py then bench/engine.py on one file, under one heading."""
    llama = ["--llama-python", args.llama_python] if args.llama_python else []
    spec = model.spec
    print(
        f"\n## {path.name}: {spec.n_layers} layers, n_embd {spec.n_embd}, n_ff {spec.n_ff}, "
        f"{spec.n_heads}/{spec.n_kv_heads} heads of {spec.head_dim}, vocab {VOCAB}, "
        f"{path.stat().st_size / GIB:.2f} GiB\n",
        flush=True,
    )
    memory_ok = run_bench("memory.py", path, ["--ctx", str(args.ctx), *llama])
    print(flush=True)
    engine_args = ["--no-startup", "--reps", str(args.reps), "--tests", ENGINE_TESTS, *llama]
    engine_ok = run_bench("engine.py", path, engine_args)
    return memory_ok and engine_ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        default=",".join(MODELS),
        help=f"comma-separated subset of {', '.join(MODELS)} (default: all, smallest first)",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=DEFAULT_DIR,
        help=f"where the files are written and kept (default {DEFAULT_DIR})",
    )
    parser.add_argument("--llama-python", help="an interpreter where llama_cpp imports (a dev virtualenv)")
    parser.add_argument("--reps", type=int, default=3, help="bench/engine.py repetitions (default 3)")
    parser.add_argument("--ctx", type=int, default=2048, help="bench/memory.py context size (default 2048)")
    parser.add_argument("--only-write", action="store_true", help="write the files, measure nothing")
    parser.add_argument("--layers", type=int, help=argparse.SUPPRESS)  # dev: a cheap N-layer trial file
    args = parser.parse_args()

    names = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    args.dir = args.dir.expanduser()
    args.dir.mkdir(parents=True, exist_ok=True)
    models = [MODELS[name].with_layers(args.layers) for name in names]

    if args.only_write:
        for model in models:
            write(model, args.dir)
        return
    if not all(model.path(args.dir).exists() for model in models):
        write_in_child(args)

    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, random weights, {args.dir}")
    failed = [model.name for model in models if not measure(model, model.path(args.dir), args)]
    if failed:
        raise SystemExit(f"failed on {', '.join(failed)}")


if __name__ == "__main__":
    main()
