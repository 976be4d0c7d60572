"""Qwen3.5's gated delta rule: its share of a prefill of the synthetic dense file, the kernel
alone at a released file's geometry (prefill and decode), the chunked form against it, and
what the chunked form would do to the synthetic files' logits and greedy tokens.

    .venv/bin/python bench/lab/delta_rule.py [--sizes 64,300,1024] [--reps 5]
        [--part all|prefill|kernel|chunked|logits] [--chunks 16,32,64] [--against FILE]

Part 1 prefills the synthetic ``qwen35`` file (written to a temporary directory) with N random
tokens through ``Engine.prefill`` (the serving path's chunks) and times the delta rule inside
it by wrapping the model's ``delta_rule``. Part 2 runs the kernel alone at 16 key heads over
32 value heads of 128 (one layer): N tokens in one call, and N tokens one call each (decode).
Part 3 (chunked) times fused/delta_chunk.py's kernel at the same geometry, per chunk size,
the token-by-token kernel between each size so both see the same load. Part 4 (logits)
prefills the synthetic dense and MoE files with the chunked form in place of the recurrence
(the goldens' prompts and random prompts of --sizes tokens) and prints the largest |logit|
difference from the recurrence over every position, then decodes 32 greedy tokens (one-token
steps run the recurrence) and counts the tokens equal to the recurrence's own run; on the
goldens' prompts it also compares the prefill's last logits with llama.cpp's recorded ones.
Best of --reps; the load average is printed before and after (the machine is shared).

--against FILE times parts 1 and 2 twice, the kernel of FILE (a copy of an earlier
fused/delta_rule.py, e.g. ``git show REV:inference/engine/fused/delta_rule.py > /tmp/old.py``)
and the current one taking turns within each repetition, so a burst of other work slows both.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # before numpy: idle BLAS threads spin otherwise

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from inference.engine.engine import Engine  # noqa: E402
from inference.engine.fused.delta_chunk import delta_rule_chunked, delta_rule_chunked_reference  # noqa: E402
from inference.engine.models import deltanet, qwen35  # noqa: E402
from inference.engine.models.deltanet import delta_rule, l2_norm, sigmoid, softplus  # noqa: E402
from tests.fixtures.synthetic_qwen35 import qwen35_path  # noqa: E402


def kernels(against: str | None) -> dict:
    """The kernels to time by name: the current one, and FILE's when given."""
    found = {"current": deltanet.delta_rule_heads}
    if against:
        spec = importlib.util.spec_from_file_location("delta_rule_against", against)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # numba's disk cache imports it by name on a later run
        spec.loader.exec_module(module)
        found = {"against": module.delta_rule_heads, **found}
    return found


def prefill_share(sizes: list[int], reps: int, against: str | None) -> None:
    engine = Engine.load(qwen35_path("qwen35", Path(tempfile.mkdtemp())))
    engine.warm_up()
    spent = [0.0]
    inner = qwen35.delta_rule
    chosen = kernels(against)

    def timed(*args):
        t = time.perf_counter()
        out = inner(*args)
        spent[0] += time.perf_counter() - t
        return out

    qwen35.delta_rule = timed
    rng = np.random.default_rng(0)
    print("synthetic qwen35, Engine.prefill: kernel, N, prefill ms, delta rule ms (best), share")
    for n in sizes:
        tokens = rng.integers(3, 150000, n).tolist()
        runs = {name: [] for name in chosen}
        for _ in range(reps):
            for name, kernel in chosen.items():
                deltanet.delta_rule_heads = kernel
                spent[0] = 0.0
                cache = engine.new_cache(n + 1)
                t = time.perf_counter()
                engine.prefill(cache, tokens)
                runs[name].append((time.perf_counter() - t, spent[0]))
        for name, timings in runs.items():
            total, rule = min(t for t, _ in timings), min(r for _, r in timings)
            print(f"  {name:8s} {n:5d}  {total * 1e3:8.2f}  {rule * 1e3:7.3f}  {rule / total:6.1%}")
    deltanet.delta_rule_heads = chosen["current"]
    qwen35.delta_rule = inner


def released_inputs(n: int, n_k: int = 16, n_v: int = 32, d: int = 128) -> tuple:
    rng = np.random.default_rng(1)
    q = l2_norm(rng.normal(size=(n, n_k, d)).astype(np.float32), 1e-6)  # (n, Hk, d)
    k = l2_norm(rng.normal(size=(n, n_k, d)).astype(np.float32), 1e-6)  # (n, Hk, d)
    v = rng.normal(size=(n, n_v, d)).astype(np.float32)  # (n, Hv, d)
    g = (softplus(rng.normal(-2, 1, (n, n_v))) * -rng.uniform(1, 8, n_v)).astype(np.float32)  # (n, Hv)
    beta = sigmoid(rng.normal(size=(n, n_v)))  # (n, Hv)
    state = np.zeros((n_v, d, d), np.float32)  # (Hv, d, d)
    return q, k, v, g, beta, state


def run_once(rule, inputs: tuple, *extra) -> float:
    """Seconds for ``rule`` over all of ``inputs`` in one call, from a copy of their state."""
    q, k, v, g, beta, state = inputs
    state = state.copy()
    t = time.perf_counter()
    rule(q, k, v, g, beta, state, *extra)
    return time.perf_counter() - t


def run_decode(inputs: tuple, m: int) -> float:
    """Seconds a token for the first ``m`` tokens of ``inputs``, one call each."""
    q, k, v, g, beta, state = inputs
    state = state.copy()
    t = time.perf_counter()
    for i in range(m):
        delta_rule(q[i : i + 1], k[i : i + 1], v[i : i + 1], g[i : i + 1], beta[i : i + 1], state)
    return (time.perf_counter() - t) / m


def kernel_alone(sizes: list[int], reps: int, against: str | None) -> None:
    print("kernel alone, 16 key heads over 32 value heads of 128: kernel, N, one call ms, ms/token;")
    print("decode ms/token")
    chosen = kernels(against)
    for n in sizes:
        inputs = released_inputs(n)
        whole = {name: np.inf for name in chosen}
        step = dict(whole)
        for kernel in chosen.values():
            deltanet.delta_rule_heads = kernel
            run_once(delta_rule, inputs)  # compile / load
        for _ in range(reps):
            for name, kernel in chosen.items():
                deltanet.delta_rule_heads = kernel
                whole[name] = min(whole[name], run_once(delta_rule, inputs))
                step[name] = min(step[name], run_decode(inputs, min(n, 64)))
        for name in chosen:
            t = whole[name]
            print(f"  {name:8s} {n:5d}  {t * 1e3:8.2f}  {t / n * 1e3:6.4f};  {step[name] * 1e3:6.4f}")
    deltanet.delta_rule_heads = chosen["current"]


def chunked_alone(sizes: list[int], chunks: list[int], reps: int) -> None:
    print(
        "chunked form alone, same geometry: N, then per chunk size C: the numba kernel ms, its numpy (BLAS)"
    )
    print("reference ms, and the token-by-token kernel ms timed beside them")
    for n in sizes:
        inputs = released_inputs(n)
        for c in chunks:
            run_once(delta_rule_chunked, inputs, c)  # compile / load
        cells = []
        for c in chunks:
            tok = chunked = blas = np.inf
            for _ in range(reps):  # taking turns, so a burst of other work slows all three
                tok = min(tok, run_once(delta_rule, inputs))
                chunked = min(chunked, run_once(delta_rule_chunked, inputs, c))
                blas = min(blas, run_once(delta_rule_chunked_reference, inputs, c))
            cells.append(f"C={c}: {chunked * 1e3:7.2f} {blas * 1e3:7.2f} (token {tok * 1e3:6.2f})")
        print(f"  {n:5d}  " + "; ".join(cells))


def greedy(engine: Engine, tokens: list[int], steps: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Every position's logits of a one-call prefill, the last one's after an Engine.prefill
    of the same tokens (the serving path's chunks), and ``steps`` greedy tokens after it."""
    logits = engine.model.forward(tokens, engine.new_cache(len(tokens) + 1), all_logits=True)
    cache = engine.new_cache(len(tokens) + steps + 1)
    last = prefilled = engine.prefill(cache, tokens)
    out = []
    for _ in range(steps):
        out.append(int(np.argmax(last)))
        last = engine.decode_one(cache, out[-1])
    return logits, prefilled, out


def llama_diff(prompt: dict, probe_ids: list[int], logits: np.ndarray) -> float:
    """The largest |logit diff| from llama.cpp's recorded prompt logits, as test_fidelity.py
    compares them (its top ids and the probe ids)."""
    ref = prompt["prompt_logits"]
    ids = np.array(ref["top_ids"] + probe_ids)
    return float(np.abs(logits[ids] - np.array(ref["top_values"] + ref["probe_values"])).max())


def logits_effect(sizes: list[int], steps: int = 32) -> None:
    goldens = Path(__file__).resolve().parents[2] / "tests" / "goldens"
    directory = Path(tempfile.mkdtemp())
    rng = np.random.default_rng(5)
    print("chunked prefill (C=64) against the recurrence: prompt, tokens, max |logit diff| over every")
    print("position, max |logit|, greedy tokens equal before the first difference; for the goldens'")
    print("prompts the largest |diff| from llama.cpp, recurrence -> chunked (llama.cpp's own spread)")
    for name in ("qwen35", "qwen35moe"):
        engine = Engine.load(qwen35_path(name, directory))
        golden = json.loads((goldens / f"generation_synthetic-{name}.json").read_text(encoding="utf-8"))
        prompts = [(p["name"], p["token_ids"], p) for p in golden["prompts"]]
        prompts += [(f"random{n}", rng.integers(3, 150000, n).tolist(), None) for n in sizes]
        for label, tokens, recorded in prompts:
            exact, exact_last, exact_tokens = greedy(engine, tokens, steps)
            qwen35.delta_rule = delta_rule_chunked
            try:
                chunked, chunked_last, chunked_tokens = greedy(engine, tokens, steps)
            finally:
                qwen35.delta_rule = delta_rule
            equal = next((i for i, (a, b) in enumerate(zip(exact_tokens, chunked_tokens)) if a != b), steps)
            diff = float(np.abs(chunked - exact).max())
            top = float(np.abs(exact).max())
            line = f"  {name:9s} {label:10s} {len(tokens):5d}  {diff:.2e}  {top:6.2f}  {equal:2d}/{steps}"
            if recorded is not None:
                before = llama_diff(recorded, golden["probe_ids"], exact_last)
                after = llama_diff(recorded, golden["probe_ids"], chunked_last)
                spread = recorded["prompt_logits"]["self_spread"]["max_abs"]
                line += f"  llama.cpp {before:.3f} -> {after:.3f} ({spread:.3f})"
            print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,300,1024")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--part", choices=("all", "prefill", "kernel", "chunked", "logits"), default="all")
    ap.add_argument("--chunks", default="16,32,64")
    ap.add_argument("--against", help="an earlier fused/delta_rule.py to time beside the current kernel")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print("load average before:", os.getloadavg())
    if args.part in ("all", "prefill"):
        prefill_share(sizes, args.reps, args.against)
    if args.part in ("all", "kernel"):
        kernel_alone(sizes, args.reps, args.against)
    if args.part in ("all", "chunked"):
        chunked_alone(sizes, [int(c) for c in args.chunks.split(",")], args.reps)
    if args.part in ("all", "logits"):
        logits_effect(sizes)
    print("load average after:", os.getloadavg())


if __name__ == "__main__":
    main()
