"""Record the reference implementation's greedy nanochat replies on the synthetic checkpoint.

A development tool, never imported by the server or the tests: it runs the reference port's
own chat CLI (fucina ``examples/nanochat``, Zig), built from a fucina checkout with the
``ziglang`` package (a dev-only tool, like llama-cpp-python):

    git clone https://github.com/matteo-grella/fucina /tmp/fucina && cd /tmp/fucina
    python -m ziglang build nanochat -Doptimize=ReleaseFast -Dblas=none -- help
    cd - && .venv/bin/python scripts/record_nanochat_goldens.py /tmp/fucina/zig-out/bin/fucina-nanochat

The checkpoint is the one the tests write (``tests.fixtures.synthetic_nanochat``, random weights
from a fixed seed). For each prompt the CLI runs ``chat -p PROMPT -t 0`` (nanochat's chat
protocol, argmax decoding, stopping at ``<|assistant_end|>`` or ``<|bos|>``) and prints the
reply's raw token bytes; ``tests/goldens/nanochat_synthetic_zig.json`` keeps them as hex, with
the reply budget. One prompt is longer than the 513-key attention window.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tests.fixtures.synthetic_nanochat import write_nanochat_checkpoint  # noqa: E402

GOLDENS = REPO_ROOT / "tests" / "goldens" / "nanochat_synthetic_zig.json"
MAX_TOKENS = 32
PROMPTS = [
    "What is the capital of France?",
    "Compute 1234 * 5678, then add 90.",
    "héllo wörld — ünïcödé, 日本語 🙂; I'm sure they've said we'll go.",
    "  spaces\tand\nnewlines\n\n end",
    "The quick brown fox jumps over the lazy dog. " * 24,  # ~700 tokens: past the 513-key window
]
MARKER = b"\nAssistant: "


def greedy_reply(binary: Path, directory: Path, prompt: str) -> bytes:
    """The reply bytes the CLI prints after its ``Assistant:`` marker."""
    out = subprocess.run(
        [
            str(binary),
            "chat",
            "--init-from",
            str(directory / "model.safetensors"),
            "--tokenizer",
            str(directory / "tokenizer.bin"),
            "-p",
            prompt,
            "-t",
            "0",
            "--max-tokens",
            str(MAX_TOKENS),
        ],
        capture_output=True,
        check=True,
        timeout=600,
    ).stdout
    start = out.index(MARKER) + len(MARKER)
    assert out.endswith(b"\n"), out[-40:]
    return out[start:-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary", type=Path, help="the reference's fucina-nanochat executable")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = write_nanochat_checkpoint(Path(tmp) / "ck")
        cases = [{"prompt": p, "reply_hex": greedy_reply(args.binary, directory, p).hex()} for p in PROMPTS]
    record = {
        "source": "fucina examples/nanochat chat CLI (Zig 0.16, ReleaseFast, -Dblas=none)",
        "max_tokens": MAX_TOKENS,
        "cases": cases,
    }
    GOLDENS.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {GOLDENS} ({len(cases)} prompts)")


if __name__ == "__main__":
    main()
