"""Record the reference implementation's output on the synthetic Inkling files (dev tool).

llama.cpp does not know ``inkling``; the reference (fucina, Zig) does. Build its example CLI
in a clone of your own (``zig build inkling -Doptimize=ReleaseFast`` with Zig 0.16, from PyPI's
``ziglang``) and point ``--exe`` at the binary (``.zig-cache/o/*/fucina-inkling``). For each
synthetic file and prompt this runs the CLI with the prompt's token ids and records the
last-position logits (top 64 and 256 fixed probe ids) and 16 greedy ids into
``tests/goldens/inkling_reference.json``, which ``tests/inference/engine/test_inkling.py``
compares the engine with. The CLI keeps keys and values in float32 (our cache rounds them to
float16, as llama.cpp's does).

    .venv/bin/python scripts/record_inkling_goldens.py --exe /path/to/fucina-inkling
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

from tests.fixtures.synthetic_inkling import GENERATOR_VERSION, inkling_path  # noqa: E402

FILES = ("inkling", "inkling-float")
PROMPT_LENGTHS = (1, 5, 13, 30)
N_GREEDY = 16
N_TOP, N_PROBES = 64, 256
GOLDENS = ROOT / "tests" / "goldens" / "inkling_reference.json"


def prompt_tokens(n: int) -> list[int]:
    """The recorded prompts: random ids of the SmolLM2 vocabulary (seeded by length)."""
    return np.random.default_rng(1000 + n).integers(3, 49000, n).tolist()


def probe_ids(vocab: int) -> list[int]:
    return np.random.default_rng(77).choice(vocab, N_PROBES, replace=False).tolist()


def run_reference(exe: Path, model: Path, tokens: list[int], work: Path) -> tuple[np.ndarray, list[int]]:
    """The CLI's last-position logits (vocab,) and its greedy ids after the prompt."""
    out = work / "logits.f32"
    ids = ",".join(map(str, tokens))
    command = [str(exe), str(model), ids, "--logits-out", str(out), "--gen", str(N_GREEDY)]
    done = subprocess.run(command, capture_output=True, timeout=1800, check=False)
    stdout = done.stdout.decode("utf-8", errors="replace")  # the decoded text may split a code point
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{stdout}\n{done.stderr.decode(errors='replace')}")
    line = next(x for x in stdout.splitlines() if x.startswith("generated ids:"))
    return np.fromfile(out, dtype=np.float32), [int(x) for x in line.split(":")[1].split()]


def record(exe: Path, synthetic_dir: Path) -> dict:
    out: dict = {"generator_version": GENERATOR_VERSION, "reference": "fucina examples/inkling", "files": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in FILES:
            model = inkling_path(name, synthetic_dir)
            cases = []
            for n in PROMPT_LENGTHS:
                tokens = prompt_tokens(n)
                logits, greedy = run_reference(exe, model, tokens, Path(tmp))
                finite = np.where(np.isfinite(logits), logits, -np.inf)
                top = np.argsort(-finite, kind="stable")[:N_TOP].tolist()
                probes = probe_ids(int(np.isfinite(logits).sum()))
                cases.append(
                    {
                        "tokens": tokens,
                        "top_ids": top,
                        "top_logits": [float(logits[i]) for i in top],
                        "probe_ids": probes,
                        "probe_logits": [float(logits[i]) for i in probes],
                        "n_neg_inf": int(np.isneginf(logits).sum()),
                        "greedy": greedy,
                    }
                )
                print(f"{name} n={n}: greedy {greedy}", flush=True)
            out["files"][name] = cases
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exe", type=Path, required=True, help="the reference's fucina-inkling binary")
    default_dir = Path(tempfile.gettempdir()) / "lmserve-synthetic"
    parser.add_argument("--synthetic-dir", type=Path, default=default_dir)
    args = parser.parse_args()
    args.synthetic_dir.mkdir(parents=True, exist_ok=True)
    GOLDENS.write_text(json.dumps(record(args.exe, args.synthetic_dir), indent=1) + "\n")
    print(f"wrote {GOLDENS}")


if __name__ == "__main__":
    main()
