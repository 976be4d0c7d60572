"""Cartridges measured: a made-up manual (bench/data/cartridge_manual.md) and 20 questions
with known answers (bench/data/cartridge_questions.json).

Arms: no context, ICL (the whole manual in the system message), and cartridges of p rows
(initialised from the manual's first p tokens) untrained and after N self-study steps. Per arm:
accuracy (an accepted answer string appears in the greedy reply), KV memory (prefix or prompt
rows in an f16 cache) and time to first token; per cartridge, training seconds per step and the
held-out distillation loss before and after. One JSON line per finished arm on stdout, so a
partial run still reports.

    NUMBA_CACHE_DIR=~/.cache/lmserve/numba .venv/bin/python bench/cartridges.py --steps 6 --accum 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleet.cartridges.build import corpus_tokens  # noqa: E402
from fleet.cartridges.file import Cartridge  # noqa: E402
from fleet.cartridges.init import initial_cartridge  # noqa: E402
from fleet.cartridges.selfstudy import SelfStudyConfig  # noqa: E402
from fleet.cartridges.train import ConversationPool, TrainConfig, held_out_pool, train_cartridge  # noqa: E402
from inference.engine.engine import Engine  # noqa: E402
from inference.model_files import DEFAULT_MODEL_FILE, DEFAULT_MODEL_PACKAGE, installed_file  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
SHADOW = -1  # token shadow of prefix rows: matches no real token


def answer(
    engine: Engine, messages: list[dict], prefix: Cartridge | None, max_tokens: int, cache=None
) -> tuple[str, float, int]:
    """Greedy reply behind an optional prefix (rows [0, p) of the cache, real tokens after):
    the text, seconds to the first token, and the KV rows the context occupied. A ``cache``
    passed in keeps the rows it shares with the prompt (the ICL arm's manual)."""
    prompt = engine.encode_chat(messages)
    rows = prefix.rows if prefix is not None else 0
    t0 = time.perf_counter()
    if cache is None:
        cache = engine.new_cache(rows + len(prompt) + max_tokens + 1)
        if prefix is not None:
            cache.k[:, :, :rows] = prefix.k.astype(np.float16)
            cache.v[:, :, :rows] = prefix.v.astype(np.float16)
            cache.commit([SHADOW] * rows)
        logits = engine.prefill(cache, prompt)
    else:
        kept = engine.reuse_prefix(cache, prompt)
        saved = cache.prefill_logits
        whole = kept == len(prompt) and saved is not None
        logits = saved[1] if whole else engine.prefill(cache, prompt[kept:])
    out: list[int] = []
    ttft = None
    while len(out) < max_tokens:
        token = int(np.argmax(logits))
        ttft = ttft if ttft is not None else time.perf_counter() - t0
        if token in engine.stop_ids:
            break
        out.append(token)
        logits = engine.decode_one(cache, token)
    return engine.tokenizer.decode(out), ttft or 0.0, rows + len(prompt)


def evaluate(
    engine: Engine, questions: list, system: str | None, prefix: Cartridge | None, max_tokens: int, cache=None
) -> dict:
    """Accuracy, TTFT (mean; with a shared ``cache`` the first question's is the cold one) and
    KV rows over the questions."""
    correct, ttfts, kv_rows, replies = 0, [], [], []
    for item in questions:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": item["q"]}
        ]
        text, ttft, rows = answer(engine, messages, prefix, max_tokens, cache)
        ok = any(a.lower() in text.lower() for a in item["a"])
        correct += ok
        ttfts.append(ttft)
        kv_rows.append(rows)
        replies.append({"q": item["q"], "reply": text, "correct": ok})
    g = engine.config.kv_geometry
    return {
        "accuracy": correct / len(questions),
        "correct": correct,
        "ttft_s_mean": float(np.mean(ttfts)),
        "ttft_s_first": ttfts[0],
        "kv_rows_mean": float(np.mean(kv_rows)),
        "kv_bytes_f16_mean": float(np.mean(kv_rows)) * g.bytes_per_position(2),
        "replies": replies,
    }


def report(record: dict, out: Path | None) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    if out is not None:
        with out.open("a") as fh:
            fh.write(line + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF path (default: SmolLM2-135M)")
    ap.add_argument("--p", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--held-out", type=int, default=2)
    ap.add_argument("--max-answer", type=int, default=96, help="bot B's answer length in self-study")
    ap.add_argument("--max-tokens", type=int, default=40, help="reply length in the evaluation")
    ap.add_argument("--questions", type=int, default=20)
    ap.add_argument("--arms", default="none,icl,cartridges")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="append the JSON lines here too")
    args = ap.parse_args()

    model = args.model or installed_file(DEFAULT_MODEL_PACKAGE, DEFAULT_MODEL_FILE)
    engine = Engine.load(model)
    corpus_path = DATA / "cartridge_manual.md"
    corpus = corpus_tokens(engine, corpus_path)
    questions = json.loads((DATA / "cartridge_questions.json").read_text())[: args.questions]
    arms = set(args.arms.split(","))
    base = {"model": Path(model).name, "corpus_tokens": len(corpus)}
    if "none" in arms:
        report({**base, "arm": "none", **evaluate(engine, questions, None, None, args.max_tokens)}, args.out)
    if "icl" in arms:
        system = "Answer from this manual.\n\n" + corpus_path.read_text()
        cache = engine.new_cache(len(corpus) + 200 + args.max_tokens)  # the manual's rows stay cached
        icl = evaluate(engine, questions, system, None, args.max_tokens, cache)
        report({**base, "arm": "icl (manual cached after question 1)", **icl}, args.out)
    if "cartridges" not in arms:
        return
    selfstudy = SelfStudyConfig(max_answer=args.max_answer)
    config = TrainConfig(
        args.steps, lr=args.lr, accum=args.accum, held_out=args.held_out, seed=args.seed, selfstudy=selfstudy
    )
    pool = ConversationPool(engine, corpus, args.seed, selfstudy)  # one pool for every p
    t0 = time.perf_counter()
    pool.take(0, args.steps * args.accum)
    held = held_out_pool(engine, corpus, config)
    held.take(0, args.held_out)
    synth_s = (time.perf_counter() - t0) / max(1, args.steps * args.accum)
    for p in args.p:
        init = initial_cartridge(engine, corpus[:p], frozen_rows=1)
        mem = {
            "cartridge_bytes_f16": init.prefix().nbytes_f16,
            "cartridge_bytes_file_f32": init.k.nbytes + init.v.nbytes,
        }
        untrained = evaluate(engine, questions, None, init, args.max_tokens)
        report({**base, "arm": f"cartridge p={p} steps=0", **mem, **untrained}, args.out)
        stamps = [time.perf_counter()]

        def stamp(*_, stamps=stamps):
            stamps.append(time.perf_counter())

        result = train_cartridge(engine, init, corpus, config, stamp, pool=pool, held=held)
        steps_s = float(np.mean(np.diff(stamps[1:]))) if len(stamps) > 2 else None
        trained = evaluate(engine, questions, None, result.cartridge, args.max_tokens)
        record = {
            **base, "arm": f"cartridge p={p} steps={args.steps}", **mem,
            "accum": args.accum, "lr": args.lr, "selfstudy_s_per_conversation": synth_s,
            "train_s_per_step": steps_s,
            "loss_held_out_first": result.loss_first, "loss_held_out_last": result.loss_last,
            "loss_history": result.history, **trained,
        }  # fmt: skip
        report(record, args.out)


if __name__ == "__main__":
    main()
