"""Cartridges measured: quality on a made-up corpus with known answers, and the build's
throughput.

    .venv/bin/python bench/cartridges.py quality [--model M] [--corpus manual] [--p 128 256] \
        [--minutes 45] [--dataset DIR]
    .venv/bin/python bench/cartridges.py throughput [--model M] [--old-tree TREE]
    .venv/bin/python bench/cartridges.py diagnose [--model M] [--corpus manual] [--p 128] --dataset DIR

``quality``: arms no context, ICL (the whole corpus in the system message), and per p a
cartridge of p rows initialised from the corpus's first p tokens, untrained and after a timed
``build_cartridge`` (synthesis then epochs, the best held-out checkpoint kept). Per arm:
accuracy (an accepted answer string appears in the greedy reply), KV memory and time to first
token; per trained cartridge the build's minutes, conversations, coverage and held-out curve.
Corpora: bench/data/cartridge_{corpus}.md with bench/data/cartridge_{corpus}_questions.json
(``manual`` keeps its historical file names). A ``--dataset`` directory keeps the synthesised
conversations, so a rerun trains on them instead of making them again.

``throughput``: seconds per self-study conversation one at a time and in lockstep batches (and,
with ``--old-tree``, through that checkout's ``synthesize_many`` in the same run), and the
student's forward + backward in GFLOP/s against ``numpy.matmul`` on the same shapes.

``diagnose``: what a cartridge can gain on a dataset's held-out conversations, as distillation
losses (nats per supervised token): the teacher's own entropy on its kept targets (the floor no
student reaches), no context (a one-row prefix: the first token), the untrained cartridge of each
p, and the whole corpus as an untrained prefix; plus the whole-corpus prefix's accuracy. When no
context and the floor are close, the conversations barely depend on the corpus and no training
on them can teach it.

One JSON line per finished measurement on stdout, so a partial run still reports.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleet.cartridges.build import CartridgeBuildSpec, build_cartridge, corpus_tokens  # noqa: E402
from fleet.cartridges.file import Cartridge, load_cartridge  # noqa: E402
from fleet.cartridges.init import initial_cartridge  # noqa: E402
from fleet.cartridges.selfstudy import SelfStudyConfig, plan_conversation, synthesize_batch  # noqa: E402
from fleet.cartridges.train import DEFAULT_LR, ConversationPool, conversation_grad, mean_loss  # noqa: E402
from inference.engine.engine import Engine  # noqa: E402
from inference.engine.sampler import SamplingParams  # noqa: E402
from inference.engine.training import PrefixForward  # noqa: E402
from inference.generation.tokens import TokenGenerator  # noqa: E402
from inference.model_files import DEFAULT_MODEL_FILE, DEFAULT_MODEL_PACKAGE, installed_file  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"


def answer(
    loop: TokenGenerator, messages: list[dict], prefix: Cartridge | None, max_tokens: int, cache=None
) -> tuple[str, float, int]:
    """Greedy reply through the server's decode loop behind an optional prefix (rows [0, p) of
    the cache, real tokens after): the text, seconds to the first token, and the KV rows the
    context occupied. A ``cache`` passed in keeps the rows it shares with the prompt (the ICL
    arm's manual)."""
    engine = loop.engine
    prompt = engine.encode_chat(messages)
    rows = prefix.rows if prefix is not None else 0
    if cache is None:
        cache = engine.new_cache(rows + len(prompt) + max_tokens + 1)
        cache.install_prefix(prefix.prefix() if prefix is not None else None, "cartridge")
    run = loop.run(cache, prompt, SamplingParams(), max_tokens)
    ttft = run.stats.prefill_seconds  # the first token is sampled from the prefill's logits
    return engine.tokenizer.decode(run.tokens), ttft, rows + len(prompt)


def evaluate(
    engine: Engine, questions: list, system: str | None, prefix: Cartridge | None, max_tokens: int, cache=None
) -> dict:
    """Accuracy, TTFT (mean; with a shared ``cache`` the first question's is the cold one) and
    KV rows over the questions."""
    correct, ttfts, kv_rows, replies = 0, [], [], []
    loop = TokenGenerator(engine)
    for item in questions:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": item["q"]}
        ]
        text, ttft, rows = answer(loop, messages, prefix, max_tokens, cache)
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


def corpus_files(name: str) -> tuple[Path, Path]:
    if name == "manual":
        return DATA / "cartridge_manual.md", DATA / "cartridge_questions.json"
    return DATA / f"cartridge_{name}.md", DATA / f"cartridge_{name}_questions.json"


def quality(args: argparse.Namespace, engine: Engine, model: Path) -> None:
    corpus_path, questions_path = corpus_files(args.corpus)
    corpus = corpus_tokens(engine, corpus_path)
    questions = json.loads(questions_path.read_text())[: args.questions]
    arms = set(args.arms.split(","))
    base = {"model": model.name, "corpus": args.corpus, "corpus_tokens": len(corpus)}
    if "none" in arms:
        report({**base, "arm": "none", **evaluate(engine, questions, None, None, args.max_tokens)}, args.out)
    if "icl" in arms:
        system = "Answer from this document.\n\n" + corpus_path.read_text()
        cache = engine.new_cache(len(corpus) + 200 + args.max_tokens)  # the corpus's rows stay cached
        icl = evaluate(engine, questions, system, None, args.max_tokens, cache)
        report({**base, "arm": "icl (corpus cached after question 1)", **icl}, args.out)
    if "cartridges" not in arms:
        return
    dataset = args.dataset or Path(tempfile.mkdtemp(prefix="selfstudy-"))
    selfstudy = SelfStudyConfig(max_answer=args.max_answer)
    for p in args.p:
        init = initial_cartridge(engine, corpus[:p], frozen_rows=1)
        mem = {
            "cartridge_bytes_f16": init.prefix().nbytes_f16,
            "cartridge_bytes_file_f32": init.k.nbytes + init.v.nbytes,
        }
        untrained = evaluate(engine, questions, None, init, args.max_tokens)
        report({**base, "arm": f"cartridge p={p} untrained", **mem, **untrained}, args.out)
        out = Path(tempfile.mkdtemp()) / f"p{p}.safetensors"
        spec = CartridgeBuildSpec(
            corpus_path,
            out,
            model,
            prefix_tokens=p,
            minutes=args.minutes,
            dataset=dataset,
            lr=args.lr,
            seed=args.seed,
            accum=args.accum,
            selfstudy=selfstudy,
            eval_every=args.eval_every,
            synthesis_share=args.synthesis_share,
        )
        built = build_cartridge(spec, None, engine)
        trained = load_cartridge(out)
        record = {
            **base,
            "arm": f"cartridge p={p} trained {args.minutes:g} min",
            **mem,
            "build_minutes": built.seconds / 60,
            "conversations": built.conversations,
            "coverage": built.coverage,
            "steps": built.steps,
            "best_step": built.best_step,
            "accum": args.accum,
            "lr": args.lr,
            "synthesis_share": args.synthesis_share,
            "loss_held_out_first": built.loss_first,
            "loss_held_out_best": built.loss_last,
            "held_out_curve": trained.training["held_out"],
            **evaluate(engine, questions, None, trained, args.max_tokens),
        }
        report(record, args.out)


def diagnose(args: argparse.Namespace, engine: Engine, model: Path) -> None:
    corpus_path, questions_path = corpus_files(args.corpus)
    corpus = corpus_tokens(engine, corpus_path)
    questions = json.loads(questions_path.read_text())[: args.questions]
    held = ConversationPool(
        engine, corpus, args.seed, SelfStudyConfig(max_answer=args.max_answer), "held_out", args.dataset
    )
    held.make(0, args.held_out)
    convs = held.take(0, args.held_out)
    probs = [c.targets.probs.astype(np.float64) for c in convs]  # (rows, k) each
    floor = float(np.mean([-(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=1).mean() for p in probs]))
    fw = PrefixForward(engine.model)
    base = {"model": model.name, "corpus": args.corpus, "corpus_tokens": len(corpus), "held_out": len(convs)}
    report({**base, "measure": "teacher entropy (floor)", "loss": floor}, args.out)
    for p, label in [(1, "no context (first token only)")] + [(p, f"untrained p={p}") for p in args.p]:
        cart = initial_cartridge(engine, corpus[:p], frozen_rows=1)
        report({**base, "measure": label, "loss": mean_loss(fw, convs, cart.k, cart.v)}, args.out)
    whole = initial_cartridge(engine, corpus, frozen_rows=1)
    record = {**base, "measure": f"whole corpus as prefix p={len(corpus)}"}
    record["loss"] = mean_loss(fw, convs, whole.k, whole.v)
    report({**record, **evaluate(engine, questions, None, whole, args.max_tokens)}, args.out)


OLD_TREE_WORKER = """
import json, sys, time
sys.path.insert(0, ".")
from fleet.cartridges.build import corpus_tokens
from fleet.cartridges.selfstudy import SelfStudyConfig, synthesize_many
from inference.engine.engine import Engine
from pathlib import Path
engine = Engine.load(sys.argv[1])
tokens = corpus_tokens(engine, Path(sys.argv[2]))
config = SelfStudyConfig(max_answer=int(sys.argv[4]))
synthesize_many(engine, tokens, seed=99, count=1, config=config)
t0 = time.perf_counter()
synthesize_many(engine, tokens, seed=0, count=int(sys.argv[3]), config=config)
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def old_tree_seconds(tree: Path, model: Path, corpus: Path, count: int, max_answer: int) -> float:
    """Seconds for ``count`` conversations through another checkout's ``synthesize_many``."""
    run = subprocess.run(
        [sys.executable, "-c", OLD_TREE_WORKER, str(model), str(corpus), str(count), str(max_answer)],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(run.stdout.strip().splitlines()[-1])["seconds"]


def synthesis_seconds(
    engine: Engine, corpus: list[int], config: SelfStudyConfig, count: int, batch: int
) -> float:
    plans = [plan_conversation(0, i, len(corpus), config) for i in range(count)]
    t0 = time.perf_counter()
    for at in range(0, count, batch):
        synthesize_batch(engine, corpus, plans[at : at + batch], config)
    return time.perf_counter() - t0


def step_flops(fw: PrefixForward, tokens: int, rows: int, head_rows: int) -> float:
    """Multiply-adds x 2 of one student forward + backward: every weight product once forward
    and once backward (the input's gradient only: weights are frozen), attention's two products
    once forward and three times backward (dq, dk and dv; the probabilities' gradient), the head
    on the supervised rows both ways."""
    w = fw.w
    per_layer = sum(m.size for m in (w.layers[0].wq, w.layers[0].wk, w.layers[0].wv, w.layers[0].wo)) + sum(
        m.size for m in (w.layers[0].w_gate, w.layers[0].w_up, w.layers[0].w_down)
    )
    weights = 2 * tokens * per_layer * len(w.layers) * 2
    attention = 2 * w.n_heads * tokens * (rows + tokens) * w.head_dim * 2 * len(w.layers) * (1 + 2)
    head = 2 * head_rows * w.head.size * 2
    return float(weights + attention + head)


def matmul_rate(fw: PrefixForward, tokens: int, repeats: int = 5) -> float:
    """numpy.matmul's GFLOP/s on the training forward's weight products at ``tokens`` rows."""
    layer = fw.w.layers[0]
    x = np.random.default_rng(0).standard_normal((tokens, layer.wq.shape[1])).astype(np.float32)
    mats = [layer.wq, layer.wk, layer.wv, layer.w_gate, layer.w_up]
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for m in mats:
            x @ m.T
        best = min(best, time.perf_counter() - t0)
    return sum(2 * tokens * m.size for m in mats) / best / 1e9


def throughput(args: argparse.Namespace, engine: Engine, model: Path) -> None:
    corpus_path, _ = corpus_files(args.corpus)
    corpus = corpus_tokens(engine, corpus_path)
    base = {"model": model.name, "corpus": args.corpus, "conversations": args.conversations}
    config = SelfStudyConfig(max_answer=args.max_answer)
    synthesis_seconds(engine, corpus, config, 1, 1)  # warm: compile and first-touch
    alone = synthesis_seconds(
        engine, corpus, SelfStudyConfig(max_answer=args.max_answer, per_span=1), args.conversations, 1
    )
    batched = synthesis_seconds(engine, corpus, config, args.conversations, args.batch)
    record = {
        **base,
        "measure": "self-study s/conversation",
        "one_at_a_time": alone / args.conversations,
        f"batch_{args.batch}_per_span_{config.per_span}": batched / args.conversations,
    }
    if args.old_tree is not None:
        old = old_tree_seconds(args.old_tree, model, corpus_path, args.conversations, args.max_answer)
        record["old_tree"] = old / args.conversations
        record["speedup_vs_old_tree"] = old / batched
    report(record, args.out)
    fw = PrefixForward(engine.model)
    conv = synthesize_batch(engine, corpus, [plan_conversation(1, 0, len(corpus), config)], config)[0]
    for p in args.p:
        cart = initial_cartridge(engine, corpus[:p], frozen_rows=1)
        conversation_grad(fw, conv, cart.k, cart.v)  # warm
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            conversation_grad(fw, conv, cart.k, cart.v)
            times.append(time.perf_counter() - t0)
        step = min(times)
        flops = step_flops(fw, len(conv.tokens), p, len(conv.head_rows))
        rate = flops / step / 1e9
        numpy_rate = matmul_rate(fw, len(conv.tokens))
        record = {
            **base,
            "measure": "student forward+backward",
            "p": p,
            "tokens": len(conv.tokens),
            "seconds": step,
            "gflops": rate,
            "numpy_matmul_gflops": numpy_rate,
            "fraction_of_numpy": rate / numpy_rate,
        }
        report(record, args.out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("quality", "throughput", "diagnose"))
    ap.add_argument("--model", type=Path, default=None, help="GGUF path (default: SmolLM2-135M)")
    ap.add_argument("--corpus", default="manual", help="bench/data/cartridge_{corpus}.md (manual)")
    ap.add_argument("--p", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--minutes", type=float, default=45.0, help="each trained cartridge's build budget")
    ap.add_argument("--dataset", type=Path, default=None, help="self-study dataset directory (kept)")
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--lr", type=float, default=DEFAULT_LR)
    ap.add_argument("--eval-every", type=int, default=8)
    ap.add_argument(
        "--synthesis-share", type=float, default=0.4, help="of --minutes, the part spent synthesising (0.4)"
    )
    ap.add_argument("--max-answer", type=int, default=96, help="bot B's answer length in self-study")
    ap.add_argument("--max-tokens", type=int, default=40, help="reply length in the evaluation")
    ap.add_argument("--questions", type=int, default=20)
    ap.add_argument("--held-out", type=int, default=16, help="diagnose: held-out conversations")
    ap.add_argument("--arms", default="none,icl,cartridges")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--conversations", type=int, default=16, help="throughput: conversations timed")
    ap.add_argument("--batch", type=int, default=16, help="throughput: lockstep batch")
    ap.add_argument("--old-tree", type=Path, default=None, help="throughput: a checkout to time too")
    ap.add_argument("--out", type=Path, default=None, help="append the JSON lines here too")
    args = ap.parse_args()

    model = args.model or Path(installed_file(DEFAULT_MODEL_PACKAGE, DEFAULT_MODEL_FILE))
    engine = Engine.load(model)
    measure = {"quality": quality, "throughput": throughput, "diagnose": diagnose}[args.what]
    measure(args, engine, model.resolve())


if __name__ == "__main__":
    main()
