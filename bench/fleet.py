"""Fleet measurements (docs/FLEET.md): build time, retrieval top-1 accuracy, answer accuracy.

    .venv/bin/python bench/fleet.py [--model PATH] [--prefix-tokens 256] [--embed-chunk 256]
                                    [--steps 0] [--rag-docs 2] [--answers] [--max-tokens 32]
                                    [--json OUT] [--keep DIR]

Builds a fleet of bench/data/fleet/docs (ten made-up documents on distinct topics; untrained
cartridges, or with ``--steps N`` jointly trained for N rounds as ``build_fleet --steps N``
trains them) into a temporary directory, then for each of the fifty questions in
bench/data/fleet/questions.json asks retrieval which document it belongs to (the FleetSource's
own path: the question as a conversation's first user message). With ``--answers``, greedy
replies under three conditions are checked for the expected answer: no context, the right
document in the prompt, and the fleet's composed prefix for each ``--rag-docs`` value (the
documents FleetSource picks, their cartridges' rows placed in front of the conversation exactly
as a served prefix sits: rows [0, P), the chat's tokens from position P on).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleet.fleets.build import FleetBuildSpec, build_fleet, chunk_texts  # noqa: E402
from fleet.fleets.format import FleetIndex  # noqa: E402
from fleet.fleets.retrieval import Retriever, embed_text, unit_rows  # noqa: E402
from fleet.fleets.source import FleetSource  # noqa: E402
from inference.engine.engine import Engine  # noqa: E402
from inference.engine.prefix import KVPrefix  # noqa: E402
from inference.engine.sampler import SamplingParams  # noqa: E402
from inference.generation.tokens import TokenGenerator  # noqa: E402
from inference.model_files import default_model_path  # noqa: E402
from inference.types import GenerationRequest, Message  # noqa: E402

DATA = ROOT / "bench" / "data" / "fleet"
NUMBER_WORDS = {"three": "3", "four": "4", "five": "5", "six": "6", "eleven": "11", "fourteen": "14"}


def answered(reply: str, expected: str) -> bool:
    """The expected answer appears in the reply (number words also as digits)."""
    reply = reply.lower().replace(",", "")
    options = {expected.lower().replace(",", ""), NUMBER_WORDS.get(expected.lower(), expected.lower())}
    return any(option in reply for option in options)


def greedy(loop: TokenGenerator, prompt: list[int], max_tokens: int, prefix: KVPrefix | None = None) -> str:
    """A greedy reply through the server's decode loop; with ``prefix``, its rows sit at [0, P)
    of the cache and the prompt starts at position P, as the served composition does."""
    engine = loop.engine
    cache = engine.new_cache((prefix.rows if prefix is not None else 0) + len(prompt) + max_tokens + 1)
    cache.install_prefix(prefix, "fleet")
    return engine.tokenizer.decode(loop.run(cache, prompt, SamplingParams(), max_tokens).tokens)


def build(engine: Engine, args, out: Path) -> dict:
    t0 = time.perf_counter()
    spec = FleetBuildSpec(DATA / "docs", out, engine.path, args.prefix_tokens, args.steps, args.embed_chunk)
    result = build_fleet(spec, engine=engine)
    return {**result.as_dict(), "seconds_per_document": (time.perf_counter() - t0) / result.documents}


def uncentred_top1(engine: Engine, source: FleetSource, questions: dict, embed_chunk: int) -> float:
    """The ablation: retrieval top-1 over the raw (not centred) chunk embeddings."""
    rows, owners = [], []
    for i, name in enumerate(source.names):
        for text in chunk_texts(engine, (DATA / "docs" / f"{name}.txt").read_text(), embed_chunk):
            rows.append(embed_text(engine, text))
            owners.append(i)
    dim = len(rows[0])
    raw = Retriever(FleetIndex(unit_rows(np.stack(rows)), np.zeros(dim, np.float32), np.array(owners)))
    hits = n = 0
    for doc, pairs in questions.items():
        for question, _ in pairs:
            picked = raw.select(embed_text(engine, question), 8, 1).documents[0]
            hits += source.names[picked] == doc
            n += 1
    return hits / n


def measure(args) -> dict:
    engine = Engine.load(args.model)
    questions = json.loads((DATA / "questions.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        fleet_dir = args.keep or Path(tmp) / "fleet"
        report = {"model": engine.model_id, "build": build(engine, args, fleet_dir)}
        loop = TokenGenerator(engine)
        if args.answers:
            report["answers"] = answers_without_fleet(engine, loop, questions, args)
        report["fleet"] = {
            k: measure_fleet(engine, loop, questions, args, fleet_dir, k) for k in args.rag_docs
        }
    return report


def answers_without_fleet(engine: Engine, loop: TokenGenerator, questions: dict, args) -> dict:
    """Answer accuracy with no context and with the right document in the user message."""
    hits = {"none": 0, "document": 0}
    for doc, pairs in questions.items():
        text = (DATA / "docs" / f"{doc}.txt").read_text()
        for question, expected in pairs:
            asks = {
                "none": [{"role": "user", "content": question}],
                "document": [{"role": "user", "content": f"{text}\n\n{question}"}],
            }
            for kind, ask in asks.items():
                reply = greedy(loop, engine.encode_chat(ask), args.max_tokens)
                hits[kind] += answered(reply, expected)
                if args.verbose:
                    print(kind, doc, question, expected, repr(reply), flush=True)
    n = sum(len(p) for p in questions.values())
    return {kind: count / n for kind, count in hits.items()}


def measure_fleet(
    engine: Engine, loop: TokenGenerator, questions: dict, args, fleet_dir: Path, rag_docs: int
) -> dict:
    """Retrieval, and with ``--answers`` answer accuracy, serving ``rag_docs`` composed cartridges."""
    source = FleetSource(fleet_dir, rag_docs=rag_docs, rag_chunks=args.rag_chunks)
    source.check(engine)
    top1 = topk = answers = 0
    misses: list = []
    t0 = time.perf_counter()
    for doc, pairs in questions.items():
        for question, expected in pairs:
            choice = source.choose(engine, GenerationRequest((Message("user", question),)))
            top1 += choice.documents[0] == doc
            if choice.documents[0] != doc:
                misses.append([question, doc, list(choice.documents)])
            topk += doc in choice.documents
            if args.answers:
                ask = engine.encode_chat([{"role": "user", "content": question}])
                reply = greedy(loop, ask, args.max_tokens, choice.prefix)
                answers += answered(reply, expected)
                if args.verbose:
                    print(
                        f"fleet{rag_docs}", doc, choice.documents, question, expected, repr(reply), flush=True
                    )
    n = sum(len(p) for p in questions.values())
    report = {
        "questions": n,
        "top1": top1 / n,
        f"in_top{rag_docs}": topk / n,
        "seconds": time.perf_counter() - t0,
        "misses": misses,
    }
    if args.ablation:
        report["top1_uncentred"] = uncentred_top1(engine, source, questions, args.embed_chunk)
    if args.answers:
        report["answers"] = answers / n
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--prefix-tokens", type=int, default=256)
    parser.add_argument("--embed-chunk", type=int, default=256)
    parser.add_argument("--steps", type=int, default=0, help="joint-training rounds (0: untrained)")
    parser.add_argument(
        "--rag-docs",
        type=lambda text: [int(k) for k in text.split(",")],
        default=[2],
        help="cartridges composed per question; several (1,2) measure each on the one build",
    )
    parser.add_argument("--rag-chunks", type=int, default=8)
    parser.add_argument("--answers", action="store_true", help="also measure answer accuracy (slow)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--ablation", action="store_true", help="also top-1 without centring")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    parser.add_argument("--keep", type=Path, default=None, help="build the fleet here and keep it")
    args = parser.parse_args()
    report = measure(args)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
