"""A cartridge trained on a self-study dataset, with its held-out loss and its accuracy on the
corpus's questions every few steps: whether a falling loss buys answers.

    .venv/bin/python bench/lab/cartridge_curve.py --dataset DIR [--corpus festival] [--p 128] \
        [--conversations 128] [--steps 192] [--every 32] [--lr 5e-2]

``train_cartridge`` runs over the dataset's first ``--conversations`` training conversations
(made if missing), shuffled into steps of ``--accum``, epoch after epoch; the held-out split's
first ``--held-out`` are the loss's. One JSON line per evaluation, then the last evaluation's replies.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.append(str(Path(__file__).resolve().parents[1]))

from cartridges import corpus_files, evaluate  # noqa: E402

from fleet.cartridges.build import corpus_tokens  # noqa: E402
from fleet.cartridges.file import Cartridge  # noqa: E402
from fleet.cartridges.init import initial_cartridge  # noqa: E402
from fleet.cartridges.selfstudy import SelfStudyConfig  # noqa: E402
from fleet.cartridges.train import ConversationPool, Evaluation, TrainConfig, train_cartridge  # noqa: E402
from inference.engine.engine import Engine  # noqa: E402
from inference.model_files import DEFAULT_MODEL_FILE, DEFAULT_MODEL_PACKAGE, installed_file  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="GGUF path (default: SmolLM2-135M)")
    ap.add_argument("--corpus", default="festival")
    ap.add_argument("--dataset", type=Path, required=True)
    ap.add_argument("--p", type=int, default=128)
    ap.add_argument("--conversations", type=int, default=128)
    ap.add_argument("--held-out", type=int, default=16)
    ap.add_argument("--steps", type=int, default=192)
    ap.add_argument("--every", type=int, default=32)
    ap.add_argument("--lr", type=float, default=5e-2)
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--max-answer", type=int, default=96)
    args = ap.parse_args()

    engine = Engine.load(args.model or installed_file(DEFAULT_MODEL_PACKAGE, DEFAULT_MODEL_FILE))
    corpus_path, questions_path = corpus_files(args.corpus)
    corpus = corpus_tokens(engine, corpus_path)
    questions = json.loads(questions_path.read_text())
    selfstudy = SelfStudyConfig(max_answer=args.max_answer)
    args.dataset.mkdir(parents=True, exist_ok=True)
    pool = ConversationPool(engine, corpus, 0, selfstudy, "train", args.dataset)
    held = ConversationPool(engine, corpus, 0, selfstudy, "held_out", args.dataset)
    held.make(0, args.held_out)
    pool.make(0, args.conversations)

    init = initial_cartridge(engine, corpus[: args.p], frozen_rows=1)
    config = TrainConfig(
        steps=args.steps,
        lr=args.lr,
        accum=args.accum,
        held_out=args.held_out,
        conversations=args.conversations,
        eval_every=args.every,
        selfstudy=selfstudy,
    )
    t0, losses, result = time.perf_counter(), [], {}

    def measure(evaluation: Evaluation) -> None:
        nonlocal result
        rows = Cartridge(evaluation.k, evaluation.v, init.fingerprint, 1, {})
        result = evaluate(engine, questions, None, rows, 40)
        record = {
            "step": evaluation.step,
            "held_out_loss": evaluation.loss,
            "train_loss": float(np.mean(losses[-args.every :])) if losses else None,
            "correct": result["correct"],
            "seconds": time.perf_counter() - t0,
        }
        print(json.dumps({"p": args.p, "lr": args.lr, **record}), flush=True)

    train_cartridge(
        engine,
        init,
        corpus,
        config,
        on_step=lambda step, total, loss: losses.append(loss),
        pool=pool,
        held=held,
        on_eval=measure,
    )
    for reply in result["replies"]:
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
