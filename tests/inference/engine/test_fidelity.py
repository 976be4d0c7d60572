"""Our engine against llama.cpp on the same GGUF: prompt logits and 32 greedy tokens.

The goldens (tests/goldens/generation_*.json, recorded by scripts/record_goldens.py) hold
llama.cpp's prompt tokens, the prompt's last logits (top 64 plus 256 fixed probe ids) and 32
greedy tokens with llama.cpp's top-2 logit margin at each step.

What "float noise" means here is measured, not assumed: the recorder re-runs each prompt in
llama.cpp with batch sizes 1 and 7 instead of 512, and stores how far llama.cpp's own logits
move (``self_spread``). Its kernels then sum in other orders, and since activations are
quantized to int8 before every product, a rounding that flips near a .5 boundary grows through
the layers: on SmolLM2 llama.cpp moves by up to 0.44 and even changes its argmax on one prompt.

Every op of our forward reproduces llama.cpp's CPU arithmetic (docs/FIDELITY.md), so the bounds
are tight where that is proven:

- SmolLM2 (Q4_1; every intermediate tensor compared bit for bit with llama.cpp's eval
  callback): prompt logits within EXACT_BOUND (measured: identical).
- The other real models (K-quants, whose int8 arithmetic we sum in another order): within
  llama.cpp's own batch-size spread (REAL_FACTOR x, plus a small floor).
- Synthetic models (every format, random weights that amplify differences): NOISE_FACTOR x.
- Greedy tokens: all 32 identical, except that where llama.cpp's own top-2 margin is below the
  model's bound (SmolLM2: NEAR_TIE) the two candidates are a tie and either may be taken; the
  comparison stops there, since the continuations legitimately part.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from inference.engine.engine import Engine
from tests.fixtures.model_files import default_model_path, optional_model_path
from tests.fixtures.synthetic_gguf import synthetic_path

pytestmark = pytest.mark.slow  # fidelity against llama.cpp's goldens

GOLDENS = sorted((Path(__file__).resolve().parents[2] / "goldens").glob("generation_*.json"))
NOISE_FACTOR = 3.0
REAL_FACTOR = 1.0
NOISE_FLOOR = 0.02  # logits; where llama.cpp's batch sizes happen to agree exactly
EXACT_BOUND = 0.02  # SmolLM2's prompt logits (issue 14: within 0.02 where llama.cpp is exact)
NEAR_TIE = 0.05  # SmolLM2's decode steps: a llama.cpp top-2 margin below this is a tie
# Models whose formats the engine multiplies per group of 32 where ggml sums each 256-weight
# block in integers and scales it once (TQ1_0, TQ2_0): the float rounding differs, and with
# llama.cpp's batch sizes agreeing exactly (spread 0) that difference is all that remains. On
# the ternary synthetic it flips an activation's rounding now and then: bitwise at 28 of the
# prose prompt's 30 positions, 0.18-0.21 at most on the three prompts. (max, mean) floors.
GROUP_ROUNDING_FLOOR = {"synthetic-llama-ternary": (0.5, 0.1)}


def golden_id(path: Path) -> str:
    return path.stem.removeprefix("generation_")


def load_golden(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def engine_for(model_file: str, synthetic_arch: str | None, synthetic_dir: Path) -> Engine:
    if synthetic_arch:
        path = synthetic_path(synthetic_arch, synthetic_dir)
    elif model_file == default_model_path().name:
        path = default_model_path()
    else:
        path = optional_model_path(model_file)
    return Engine.load(path)


@pytest.fixture(params=GOLDENS, ids=golden_id)
def case(request, synthetic_dir):
    golden = load_golden(request.param)
    arch = golden.get("synthetic_arch", golden["architecture"]) if golden["synthetic"] else None
    return golden, engine_for(golden["model_file"], arch, synthetic_dir)


def _bounds(golden: dict, spread: dict) -> tuple[float, float, float]:
    """(max, mean) bounds on |logit diff| and the top-2 margin below which greedy may part."""
    if golden["model_file"] == default_model_path().name:
        return EXACT_BOUND, EXACT_BOUND, NEAR_TIE
    factor = NOISE_FACTOR if golden["synthetic"] else REAL_FACTOR
    max_floor, mean_floor = GROUP_ROUNDING_FLOOR.get(golden["name"], (NOISE_FLOOR, NOISE_FLOOR))
    max_bound = max(factor * spread["max_abs"] + NOISE_FLOOR, max_floor)
    return max_bound, max(factor * spread["mean_abs"] + NOISE_FLOOR, mean_floor), max_bound


def model_spread(golden: dict) -> float:
    """The largest of llama.cpp's batch-size spreads over the model's prompts."""
    return max(p["prompt_logits"]["self_spread"]["max_abs"] for p in golden["prompts"])


def run_prompt(engine: Engine, tokens: list[int], path: list[int]) -> tuple[np.ndarray, list[int], list]:
    """Prefill ``tokens``, then decode along ``path`` (llama.cpp's greedy tokens): at each step
    our argmax and our logits, then llama.cpp's token appended, so a step where we part at a
    tie does not end the comparison of the steps after it."""
    cache = engine.new_cache(len(tokens) + len(path) + 1)
    logits = engine.prefill(cache, tokens)
    prompt_logits, ours, step_logits = logits, [], []
    for token in path:
        step_logits.append(logits)
        ours.append(int(np.argmax(logits)))
        logits = engine.decode_one(cache, token)
    return prompt_logits, ours, step_logits


def test_tokenization_of_prompts_matches(case):
    golden, engine = case
    for prompt in golden["prompts"]:
        assert engine.encode_prompt(prompt["text"]) == prompt["token_ids"], prompt["name"]


def test_prompt_logits_and_greedy_tokens_match_llama_cpp(case):
    golden, engine = case
    for prompt in golden["prompts"]:
        expected, margins = prompt["greedy"]["tokens"], prompt["greedy"]["margins"]
        logits, ours, step_logits = run_prompt(engine, prompt["token_ids"], expected)
        ref, name = prompt["prompt_logits"], prompt["name"]
        spread = ref["self_spread"]
        ids = np.array(ref["top_ids"] + golden["probe_ids"])
        diff = np.abs(logits[ids] - np.array(ref["top_values"] + ref["probe_values"]))
        max_bound, mean_bound, tie = _bounds(golden, spread)
        if golden["synthetic"]:
            # llama.cpp's greedy steps run its one-row kernels, whose distance from its batch
            # kernels varies by position: one prompt's spread may be 0 where another's is not.
            tie = max(tie, NOISE_FACTOR * model_spread(golden) + NOISE_FLOOR)
        assert diff.max() <= max_bound, f"{name}: max |logit diff| {diff.max():.3f} > {max_bound:.3f}"
        assert diff.mean() <= mean_bound, f"{name}: mean |logit diff| {diff.mean():.3f} > {mean_bound:.3f}"
        for step, (got, want) in enumerate(zip(ours, expected, strict=True)):
            if got == want:
                continue
            gap = float(step_logits[step][want] - step_logits[step][got])
            assert margins[step] < tie, (
                f"{name}: step {step} chose {got}, llama.cpp {want} "
                f"(llama.cpp margin {margins[step]:.4f} > tie bound {tie:.3f}; ours {gap:.4f})"
            )


CONTINUATIONS = Path(__file__).resolve().parents[2] / "goldens" / "continuation_smollm2.json"
CONTINUATION_BOUND = 1e-4  # the goldens keep 5 decimals: equal logits


def test_smollm2_continuations_equal_llama_cpp_one_batch_logits():
    # The prompt and its 32 recorded greedy tokens in one forward, every row's logits against
    # llama.cpp's one-batch evaluation of the same tokens (scripts/record_path_goldens.py):
    # equal at every step. llama.cpp's own token-by-token decode departs from its batch path
    # once the context passes 32 tokens (decode_path_max_abs, up to 1.22): that, not an op of
    # ours, is where the code prompt's greedy continuation parts from llama.cpp's at step 29.
    continuation = json.loads(CONTINUATIONS.read_text(encoding="utf-8"))
    generation = load_golden(GOLDENS[0].parent / "generation_smollm2.json")
    engine = engine_for(default_model_path().name, None, Path())
    probe_ids = np.array(continuation["probe_ids"])
    for prompt, steps in zip(generation["prompts"], continuation["prompts"], strict=True):
        tokens, greedy = prompt["token_ids"], prompt["greedy"]["tokens"]
        cache = engine.new_cache(len(tokens) + len(greedy))
        rows = engine.model.forward(tokens + greedy, cache, all_logits=True)[len(tokens) - 1 : -1]
        for step, (ours, ref) in enumerate(zip(rows, steps["steps"], strict=True)):
            ids = np.concatenate([ref["top_ids"], probe_ids])
            diff = np.abs(ours[ids] - np.array(ref["top_values"] + ref["probe_values"])).max()
            assert diff <= CONTINUATION_BOUND, f"{prompt['name']} step {step}: max |logit diff| {diff:.5f}"
    decode_spread = max(s["decode_path_max_abs"] for p in continuation["prompts"] for s in p["steps"])
    assert decode_spread > 0.4  # llama.cpp's decode loop is not its batch path past 32 tokens
