"""Building a fleet: one cartridge per document, a retrieval index, optional joint training.

``build_fleet`` is the one function ``manage.py build_fleet`` and the Celery job run. The
per-document work (the initialisation prefill and the chunk embeddings) is embarrassingly
parallel: :func:`prepare_document` is a top-level function of one JSON-serialisable dict, so a
caller may fan it out (``mapper``: e.g. a Celery group, fleet/services/fanout.py) over however
many workers exist; without a mapper it runs here, in order, with progress and cancellation
between documents. Everything is written into a temporary sibling directory renamed into place
at the end: a failed or cancelled build leaves nothing behind.
"""

from __future__ import annotations

import functools
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from fleet.cartridges.build import BuildCancelled, BuildProgress, SilentProgress, corpus_tokens
from fleet.cartridges.file import save_cartridge
from fleet.cartridges.init import initial_cartridge
from fleet.cartridges.train import DEFAULT_LR
from inference.engine.engine import Engine

from . import train
from .format import FleetDocument, FleetIndex, FleetManifest, write_index, write_manifest
from .retrieval import centre, embed_text

PREPARE_DOCUMENT = "fleet.fleets.build.prepare_document"

# fn_name (a dotted path to a top-level function of one dict), items -> results in order.
Mapper = Callable[[str, list[dict]], list[dict]]


@dataclass(frozen=True)
class FleetBuildSpec:
    """What to build; the fields of ``manage.py build_fleet``."""

    docs_dir: Path  # one document per file; its name is the file's stem
    out: Path  # the fleet directory to create (absent or empty)
    model: Path  # the GGUF the fleet is for
    prefix_tokens: int = 256  # p: rows of each document's cartridge
    steps: int = 0  # joint-training steps; 0 keeps the untrained initialisations
    embed_chunk: int = 256  # tokens per retrieval chunk
    frozen_rows: int = 1
    lr: float = DEFAULT_LR
    seed: int = 0
    held_out: int = 8  # held-out conversations per document: each file keeps its best checkpoint


@dataclass(frozen=True)
class FleetBuildResult:
    """The summary the command prints as its last line (JSON)."""

    path: str
    documents: int
    chunks: int
    steps: int
    seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


def document_files(docs_dir: Path) -> list[Path]:
    """The documents of ``docs_dir`` in name order (hidden files skipped); ValueError when there
    are none or two share a stem."""
    if not docs_dir.is_dir():
        raise ValueError(f"{docs_dir}: no such directory of documents")
    files = sorted(p for p in docs_dir.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise ValueError(f"{docs_dir}: no documents (one file per document)")
    stems = [p.stem for p in files]
    repeated = sorted({s for s in stems if stems.count(s) > 1})
    if repeated:
        raise ValueError(f"{docs_dir}: several files share the document name(s) {', '.join(repeated)}")
    unfit = [p.stem for p in files if "," in p.stem or not p.stem.isprintable()]
    if unfit:
        raise ValueError(f"{docs_dir}: document names may not hold commas or control characters: {unfit}")
    return files


@functools.lru_cache(maxsize=1)
def _engine_for(model: str) -> Engine:
    """A worker process loads the model once for all the documents it is handed."""
    return Engine.load(model)


def prepare_document(item: dict) -> dict:
    """One document's share of a build, by plain arguments (runs in a Celery worker as well):
    writes its initial cartridge and returns its token count, rows and chunk embeddings."""
    return _prepare(_engine_for(item["model"]), item)


def chunk_texts(engine: Engine, text: str, chunk_tokens: int) -> list[str]:
    """The text cut into retrieval chunks of ``chunk_tokens`` tokens (blank ones dropped)."""
    body = engine.tokenizer.encode(text, add_bos=False, parse_special=False)
    texts = [engine.tokenizer.decode(body[i : i + chunk_tokens]) for i in range(0, len(body), chunk_tokens)]
    return [t for t in texts if t.strip()]


def _prepare(engine: Engine, item: dict) -> dict:
    path = Path(item["document"])
    try:
        tokens = corpus_tokens(engine, path)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc})") from exc
    rows = min(item["prefix_tokens"], len(tokens))
    cartridge = initial_cartridge(
        engine,
        tokens[:rows],
        min(item["frozen_rows"], rows),
        {"document": item["name"], "tokens": len(tokens)},
    )
    save_cartridge(item["cartridge"], cartridge)
    texts = chunk_texts(engine, path.read_text(encoding="utf-8"), item["embed_chunk"])
    vectors = [embed_text(engine, t).tolist() for t in texts]
    return {
        "name": item["name"],
        "tokens": len(tokens),
        "rows": rows,
        "embeddings": vectors,
        "fingerprint": engine.fingerprint.hex(),
    }


def _check_spec(spec: FleetBuildSpec) -> list[Path]:
    if spec.prefix_tokens < 1 or spec.embed_chunk < 1:
        raise ValueError("--prefix-tokens and --embed-chunk must be at least 1")
    if spec.steps < 0:
        raise ValueError("--steps must not be negative")
    if spec.held_out < 0:
        raise ValueError("--held-out must not be negative")
    if spec.out.exists() and (not spec.out.is_dir() or any(spec.out.iterdir())):
        raise ValueError(f"{spec.out}: already exists and is not an empty directory")
    return document_files(spec.docs_dir)


def _run_in_process(engine: Engine, items: list[dict], progress: BuildProgress) -> list[dict]:
    results = []
    for i, item in enumerate(items):
        if progress.cancelled():
            raise BuildCancelled(f"cancelled after {i} of {len(items)} documents")
        results.append(_prepare(engine, item))
        progress.on_step(i + 1, len(items), None)
        progress.on_log(
            f"{item['name']}: {results[-1]['tokens']} tokens, {len(results[-1]['embeddings'])} chunks"
        )
    return results


def _train_jointly(
    directory: Path,
    engine: Engine,
    spec: FleetBuildSpec,
    items: list[dict],
    manifest: FleetManifest,
    progress: BuildProgress,
) -> FleetManifest:
    """Train every document's cartridge in place by joint self-study (fleet.fleets.train: mixed
    visibility under a resident budget) and record each one's steps in the manifest."""
    documents = [
        train.FleetDocument(
            item["name"], corpus_tokens(engine, Path(item["document"])), Path(item["cartridge"])
        )
        for item in items
    ]
    config = train.JointConfig(rounds=spec.steps, lr=spec.lr, held_out=spec.held_out, seed=spec.seed)
    progress.on_log(f"joint training: {spec.steps} rounds over {len(documents)} cartridges")
    try:
        result = train.train_fleet(engine, documents, config, progress.on_step, progress.cancelled)
    except train.TrainingCancelled as exc:
        raise BuildCancelled(str(exc)) from exc
    for document in documents:  # the optimizer state is the build's, not the fleet's
        document.state_path.unlink(missing_ok=True)
    trained = tuple(trained_document(d, result) for d in manifest.documents)
    for doc in trained:
        if doc.kept_step is not None and doc.held_out_initial is not None:
            progress.on_log(
                f"{doc.name}: kept step {doc.kept_step} of {doc.steps}, held-out loss "
                f"{doc.held_out_loss:.4f} (untrained {doc.held_out_initial:.4f})"
            )
    training = {
        "method": "joint",
        "rounds": spec.steps,
        "seed": spec.seed,
        "lr": spec.lr,
        "held_out": spec.held_out,
    }
    manifest = replace(manifest, documents=trained, steps=spec.steps, training=training)
    write_manifest(directory, manifest)
    return manifest


def trained_document(document: FleetDocument, result: train.JointResult) -> FleetDocument:
    """A document's manifest entry after joint training: its steps, and the checkpoint kept."""
    kept = result.kept.get(document.name)
    return replace(
        document,
        steps=result.steps.get(document.name, 0),
        kept_step=kept.step if kept else None,
        held_out_loss=kept.loss if kept else None,
        held_out_initial=result.initial_loss.get(document.name),
    )


def build_fleet(
    spec: FleetBuildSpec,
    progress: BuildProgress | None = None,
    engine: Engine | None = None,
    mapper: Mapper | None = None,
) -> FleetBuildResult:
    """Build the fleet ``spec`` describes. Raises ValueError on bad input, BuildCancelled when
    ``progress.cancelled()`` turns true; neither leaves a directory behind."""
    progress = progress or SilentProgress()
    t0 = time.perf_counter()
    files = _check_spec(spec)
    engine = engine or _engine_for(str(spec.model))
    tmp = spec.out.with_name(f".{spec.out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        items = [
            {
                "model": str(spec.model),
                "document": str(path),
                "name": path.stem,
                "cartridge": str(tmp / f"doc-{i:03d}.safetensors"),
                "prefix_tokens": spec.prefix_tokens,
                "frozen_rows": spec.frozen_rows,
                "embed_chunk": spec.embed_chunk,
            }
            for i, path in enumerate(files)
        ]
        progress.on_log(f"{len(items)} documents: initial cartridges and index embeddings")
        results = mapper(PREPARE_DOCUMENT, items) if mapper else _run_in_process(engine, items, progress)
        manifest = _write_fleet(tmp, engine, spec, results)
        if spec.steps > 0:
            manifest = _train_jointly(tmp, engine, spec, items, manifest, progress)
        if progress.cancelled():
            raise BuildCancelled("cancelled before the fleet was moved into place")
        if spec.out.exists():
            spec.out.rmdir()  # checked empty above
        os.replace(tmp, spec.out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    chunks = sum(doc.chunks for doc in manifest.documents)
    return FleetBuildResult(
        str(spec.out), len(manifest.documents), chunks, spec.steps, time.perf_counter() - t0
    )


def _write_fleet(directory: Path, engine: Engine, spec: FleetBuildSpec, results: list[dict]) -> FleetManifest:
    """The index (centred chunk embeddings) and the manifest of the prepared documents."""
    documents, rows, owners = [], [], []
    fingerprint = engine.fingerprint.hex()
    for i, result in enumerate(results):
        if result["fingerprint"] != fingerprint:
            raise ValueError(f"document {result['name']} was prepared with another model than {spec.model}")
        vectors = np.asarray(result["embeddings"], np.float32).reshape(-1, engine.config.n_embd)
        if not len(vectors):
            raise ValueError(f"document {result['name']} has no text to index")
        rows.append(vectors)
        owners += [i] * len(vectors)
        documents.append(
            FleetDocument(
                result["name"], f"doc-{i:03d}.safetensors", result["tokens"], result["rows"], 0, len(vectors)
            )
        )
    embeddings, centroid = centre(np.concatenate(rows))
    write_index(directory, FleetIndex(embeddings, centroid, np.asarray(owners, np.int64)), fingerprint)
    manifest = FleetManifest(
        model_fingerprint=fingerprint,
        model=Path(engine.path).name,
        p=spec.prefix_tokens,
        frozen_rows=spec.frozen_rows,
        embed_chunk=spec.embed_chunk,
        embed_dim=engine.config.n_embd,
        documents=tuple(documents),
        training={"method": "initial", "seed": spec.seed, "lr": spec.lr},
    )
    write_manifest(directory, manifest)
    return manifest
