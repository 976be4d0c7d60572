"""One shard of a self-study dataset as a fan-out document task: the unit of distributed synthesis.

:func:`synthesize_shard` takes one JSON-able item (a :class:`ShardJob`), loads the model once per
process, synthesises the shard's missing conversations into the dataset directory
(``dataset.write_shard``, resumable) and returns only the shard's path and counts: the
conversations themselves never travel through the broker, so every worker must see the dataset
directory, the model and the corpus at the same paths (one machine, or a shared filesystem).

The item carries the driver's dataset header too: a worker whose model file or corpus differs
from the driver's refuses, rather than writing a shard the dataset would later refuse.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from fleet.cartridges.build import corpus_tokens
from fleet.cartridges.dataset import DatasetHeader, write_shard
from fleet.cartridges.selfstudy import SelfStudyConfig
from fleet.fleets.build import _engine_for  # the per-process engine cache fleet workers already use
from fleet.services.fanout import document_task
from inference.engine.engine import Engine

SYNTHESIZE_SHARD = "fleet.cartridges.synthesis_task:synthesize_shard"

# Batch-level progress for a shard synthesised in this very process (the in-process mapper): a
# worker elsewhere cannot call back, so there the caller only learns of whole shards.
batch_listener: ContextVar[Callable[[int], None] | None] = ContextVar(
    "lmserve_selfstudy_batch_listener", default=None
)


@dataclass(frozen=True)
class ShardJob:
    """Conversations ``first .. first + count - 1`` of ``split``, by plain (JSON-able) values."""

    model: str  # GGUF path, the same on every worker
    corpus: str  # corpus file path
    dataset: str  # the dataset directory the shard is written into
    seed: int
    split: str  # "train" or "held_out"
    first: int
    count: int
    batch: int
    selfstudy: dict  # SelfStudyConfig's fields
    expect: dict | None = None  # the driver's DatasetHeader fields, checked against this worker's

    def as_item(self) -> dict:
        """The item the fan-out sends."""
        return asdict(self)

    @classmethod
    def from_item(cls, item: dict) -> ShardJob:
        """The job back from an item (unknown keys refused: a newer driver's item is not guessed at)."""
        names = {f.name for f in fields(cls)}
        unknown = set(item) - names
        if unknown:
            raise ValueError(f"unknown shard job fields: {', '.join(sorted(unknown))}")
        return cls(**item)


@dataclass(frozen=True)
class ShardDone:
    """What a shard task returns: where the shard is and how many conversations it holds."""

    path: str
    conversations: int  # of the job's range, now all in the shard
    made: int  # of those, synthesised by this task (0 when the shard was complete already)

    def as_dict(self) -> dict:
        return asdict(self)


def shard_header(
    engine: Engine, corpus: str | Path, seed: int, config: SelfStudyConfig
) -> tuple[list[int], DatasetHeader]:
    """The corpus's tokens and the dataset header they, the model and the settings give."""
    path = Path(corpus)
    try:
        tokens = corpus_tokens(engine, path)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc})") from exc
    return tokens, DatasetHeader.describe(engine, tokens, seed, config)


@document_task
def synthesize_shard(item: dict) -> dict:
    """Write (or finish) one shard of a self-study dataset; returns :class:`ShardDone` as a dict."""
    job = ShardJob.from_item(item)
    engine = _engine_for(job.model)
    tokens, header = shard_header(engine, job.corpus, job.seed, SelfStudyConfig(**job.selfstudy))
    if job.expect is not None:
        expected = DatasetHeader(**job.expect)
        field = expected.mismatch(header)
        if field is not None:
            theirs, ours = asdict(expected)[field], asdict(header)[field]
            raise ValueError(
                f"worker {socket.gethostname()}: its {field} is {ours!r}, the dataset's is {theirs!r} "
                f"(does it see the same model {job.model} and corpus {job.corpus}?)"
            )
    made = [0]
    listener = batch_listener.get()

    def on_batch(n: int) -> None:
        made[0] += n
        if listener is not None:
            listener(n)

    path = write_shard(
        engine, tokens, Path(job.dataset), header, job.split, job.first, job.count, job.batch, on_batch
    )
    return ShardDone(str(path), job.count, made[0]).as_dict()
