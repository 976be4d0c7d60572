"""Record the reference implementation's canvas logits on the synthetic DiffusionGemma file.

A development tool, never imported by the server: llama.cpp has no released diffusion-gemma,
the reference (fucina, Zig) does. Its example CLI has a logit-parity harness (``--eval``:
encode the prompt causally, run one bidirectional canvas forward, dump the raw f32
``[canvas_length, vocab]`` logits; ``--sc-logits`` feeds a previous step's logits as the
self-conditioning signal at temperature 1). Build it in a clone of your own with Zig 0.16
from PyPI's ``ziglang`` (a dev-only tool, like llama-cpp-python):

    git clone https://github.com/matteo-grella/fucina /tmp/fucina && cd /tmp/fucina
    python -m ziglang build diffusion-gemma -Doptimize=ReleaseFast -Dblas=none -- --help
    cd - && .venv/bin/python scripts/record_diffusion_goldens.py \
        --exe /tmp/fucina/.zig-cache/o/*/fucina-diffusion-gemma

For each case (a prompt, a canvas, with or without self-conditioning) this keeps, per canvas
row, the top 16 ids and their logits and the logits of 64 fixed probe ids in
``tests/goldens/diffusion_gemma_reference.json``, which
``tests/inference/engine/test_diffusion_gemma.py`` compares the engine with. The previous
step's logits behind the self-conditioned cases are not stored: both sides make every input
from the seeds in ``tests/fixtures/diffusion_reference_cases.py``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from inference.engine.gguf_file import GGUFFile  # noqa: E402
from tests.fixtures.diffusion_reference_cases import (  # noqa: E402
    CASES,
    canvas_tokens,
    previous_logits,
    probe_ids,
    prompt_tokens,
)
from tests.fixtures.synthetic_diffusion_gemma import CANVAS, GENERATOR_VERSION, diffusion_gemma_path  # noqa: E402

GOLDENS = ROOT / "tests" / "goldens" / "diffusion_gemma_reference.json"
N_TOP = 16


def run_reference(exe: Path, model: Path, prompt: list[int], canvas: list[int], sc: Path | None, work: Path):
    """The CLI's canvas logits (canvas, vocab)."""
    out = work / "logits.f32"
    command = [str(exe), str(model), "--eval", ",".join(map(str, prompt))]
    command += ["--canvas", ",".join(map(str, canvas)), "--logits-out", str(out)]
    if sc is not None:
        command += ["--sc-logits", str(sc)]
    done = subprocess.run(command, capture_output=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout.decode()}\n{done.stderr.decode()}")
    return np.fromfile(out, dtype=np.float32).reshape(CANVAS, -1), done.stdout.decode()


def record(exe: Path, synthetic_dir: Path) -> dict:
    model = diffusion_gemma_path(synthetic_dir)
    vocab = len(GGUFFile(model).metadata["tokenizer.ggml.tokens"])
    probes = probe_ids(vocab)
    out: dict = {
        "generator_version": GENERATOR_VERSION,
        "reference": "fucina examples/diffusion_gemma --eval",
        "probe_ids": probes,
        "cases": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for n, seed, self_conditioned in CASES:
            prompt, canvas = prompt_tokens(n, vocab), canvas_tokens(seed, vocab)
            sc = None
            if self_conditioned:
                sc = work / "previous.f32"
                previous_logits(seed, vocab).tofile(sc)
            logits, stdout = run_reference(exe, model, prompt, canvas, sc, work)
            top = np.argsort(-logits, axis=1, kind="stable")[:, :N_TOP]  # (canvas, N_TOP)
            out["cases"].append(
                {
                    "prompt": prompt,
                    "canvas": canvas,
                    "self_conditioned": self_conditioned,
                    "previous_seed": seed if self_conditioned else None,
                    "top_ids": top.tolist(),
                    "top_logits": np.take_along_axis(logits, top, axis=1).tolist(),
                    "probe_logits": logits[:, probes].tolist(),
                }
            )
            print(f"prompt {n}, canvas seed {seed}, sc {self_conditioned}: {stdout.splitlines()[-1]}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--exe", type=Path, required=True, help="the built fucina-diffusion-gemma")
    parser.add_argument("--synthetic-dir", type=Path, default=None, help="where the synthetic file lives")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        goldens = record(args.exe, args.synthetic_dir or Path(tmp))
    GOLDENS.write_text(json.dumps(goldens) + "\n")
    print(f"wrote {GOLDENS}")


if __name__ == "__main__":
    main()
