"""Synthesising a self-study dataset in shards: in this process, or on however many Celery workers.

``manage.py synthesize_selfstudy`` calls :func:`synthesize_dataset`. The conversations asked for
are cut into contiguous ranges, one shard file each (``fleet/cartridges/dataset.py``), and the
shard task (``fleet/cartridges/synthesis_task.py``) is mapped over them with
:func:`fleet.services.fanout.map_documents`: in this process by default, on Celery workers inside
``with using(celery_map)``. A conversation depends only on the dataset header and its index, so
the dataset is the same whoever writes which shard, and a rerun only makes what is missing.

One shard has one writer at a time (nothing locks it): keep a shard's synthesis well under the
broker's visibility timeout (Redis: an hour by default), since late acknowledgement
(``CELERY_TASK_ACKS_LATE``) redelivers a longer task to a second worker, which would append to
the same file. More ``shards`` make each shorter.

Like ``fanout`` this module imports nothing from Django: a job or a script may call it as well.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fleet.cartridges.build import BuildCancelled, BuildProgress, SilentProgress
from fleet.cartridges.dataset import SPLITS, DatasetHeader, load_split, shard_path
from fleet.cartridges.selfstudy import SelfStudyConfig
from fleet.cartridges.synthesis_task import (
    SYNTHESIZE_SHARD,
    ShardDone,
    ShardJob,
    batch_listener,
    shard_header,
)
from fleet.fleets.build import _engine_for
from inference.engine.engine import Engine

from .fanout import Cancelled, current_mapper_name, map_documents

MAX_INDEX = 999_999  # shard names are zero-padded to six digits: past that they no longer sort in order


@dataclass(frozen=True)
class SynthesisSpec:
    """What to synthesise; the fields of ``manage.py synthesize_selfstudy``. Paths should be
    absolute: workers elsewhere open them as they are."""

    corpus: Path
    dataset: Path  # the dataset directory (created when absent)
    model: Path
    conversations: int = 64  # train conversations first .. first + conversations - 1
    first: int = 0
    shards: int = 1  # contiguous ranges, one shard file (and one fan-out item) each
    held_out: int = 0  # held-out conversations 0 .. held_out - 1, one more shard
    seed: int = 0
    batch: int = 16  # conversations decoded in lockstep, appended and flushed together
    selfstudy: SelfStudyConfig = field(default_factory=SelfStudyConfig)


@dataclass(frozen=True)
class SynthesisResult:
    """The summary the command prints as its last line (JSON)."""

    dataset: str
    conversations: int  # train conversations now in the dataset (any writer's)
    held_out: int  # held-out conversations now in the dataset
    shards: list[str]  # the shard files of this run's ranges
    seconds: float
    made: int  # conversations this run synthesised (0 for a complete dataset)

    def as_dict(self) -> dict:
        return asdict(self)


def shard_ranges(first: int, count: int, shards: int) -> list[tuple[int, int]]:
    """``first .. first + count`` cut into ``shards`` contiguous ``(start, end)`` ranges whose
    sizes differ by one at most."""
    bounds = [first + (i * count) // shards for i in range(shards + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def check_spec(spec: SynthesisSpec) -> None:
    """ValueError naming the first thing wrong with ``spec`` (before any model is loaded)."""
    if spec.conversations < 1:
        raise ValueError(f"--conversations {spec.conversations}: at least one conversation")
    if spec.shards < 1 or spec.shards > spec.conversations:
        raise ValueError(f"--shards {spec.shards}: between 1 and --conversations ({spec.conversations})")
    if spec.first < 0 or spec.held_out < 0:
        raise ValueError("--first and --held-out must be 0 or more")
    if spec.batch < 1:
        raise ValueError(f"--batch {spec.batch}: at least 1")
    if max(spec.first + spec.conversations, spec.held_out) > MAX_INDEX:
        raise ValueError(f"conversation ranges must end by {MAX_INDEX} (shard names have six-digit indices)")
    if not spec.corpus.is_file():
        raise ValueError(f"{spec.corpus}: no such corpus file")
    if spec.dataset.exists() and not spec.dataset.is_dir():
        raise ValueError(f"{spec.dataset}: the dataset must be a directory")


def synthesize_dataset(
    spec: SynthesisSpec, progress: BuildProgress | None = None, engine: Engine | None = None
) -> SynthesisResult:
    """Make every conversation of ``spec``'s ranges that the dataset lacks, one fan-out item per
    shard. ValueError for a bad spec or a dataset synthesised from another model, corpus, seed or
    settings (naming the shard and the field); BuildCancelled when ``progress.cancelled()`` turns
    true (what was written stays, and a rerun resumes from it).

    Progress counts conversations when the shards run here; on Celery workers, whole shards."""
    progress = progress or SilentProgress()
    t0 = time.perf_counter()
    check_spec(spec)
    engine = engine or _engine_for(str(spec.model))
    _, header = shard_header(engine, spec.corpus, spec.seed, spec.selfstudy)
    # Read the whole directory first: a shard of another dataset is refused here, by name, before
    # any worker writes a shard beside it; and ranges that other shards (a run cut into other
    # ranges, another machine's) already hold are not sent at all.
    have = {split: set(_held(spec.dataset, header, split)) for split in SPLITS}
    ranges = [("train", a, b) for a, b in shard_ranges(spec.first, spec.conversations, spec.shards)]
    if spec.held_out:
        ranges.append(("held_out", 0, spec.held_out))
    jobs, complete = [], []
    for split, a, b in ranges:
        missing = sum(1 for i in range(a, b) if i not in have[split])
        if missing:
            jobs.append((missing, _job(spec, header, split, a, b)))
        elif shard_path(spec.dataset, split, a, b).exists():
            complete.append(shard_path(spec.dataset, split, a, b))
    total = sum(missing for missing, _ in jobs)
    where = current_mapper_name()
    progress.on_log(
        f"{spec.dataset}: {len(have['train'])} train and {len(have['held_out'])} held-out conversations "
        f"there; making {total} in {len(jobs)} shard(s) {where}"
    )
    results = _run([job for _, job in jobs], total, where == "in-process", progress)
    shards = sorted({*complete, *(Path(r.path) for r in results)}, key=_shard_order)
    return SynthesisResult(
        dataset=str(spec.dataset),
        conversations=len(_held(spec.dataset, header, "train")),
        held_out=len(_held(spec.dataset, header, "held_out")),
        shards=[str(p) for p in shards],
        seconds=round(time.perf_counter() - t0, 3),
        made=sum(r.made for r in results),
    )


def _held(directory: Path, header: DatasetHeader, split: str) -> dict:
    return load_split(directory, header, split) if directory.is_dir() else {}


def _job(spec: SynthesisSpec, header: DatasetHeader, split: str, first: int, end: int) -> ShardJob:
    return ShardJob(
        model=str(spec.model),
        corpus=str(spec.corpus),
        dataset=str(spec.dataset),
        seed=spec.seed,
        split=split,
        first=first,
        count=end - first,
        batch=spec.batch,
        selfstudy=asdict(spec.selfstudy),
        expect=asdict(header),
    )


def _shard_order(path: Path) -> tuple[int, str]:
    # train shards first, each split's in index order (the zero-padded names sort as numbers)
    return (0 if path.name.startswith("train-") else 1, path.name)


def _run(jobs: list[ShardJob], total: int, here: bool, progress: BuildProgress) -> list[ShardDone]:
    """The shard jobs through the current mapper, reporting conversations (here) or shards."""
    made = [0]

    def on_batch(n: int) -> None:
        made[0] += n
        progress.on_step(made[0], total, None)
        if progress.cancelled():  # between batches: what is flushed is kept
            raise BuildCancelled(f"cancelled after {made[0]} of {total} conversations")

    def on_done(done: int, count: int) -> None:
        if not here:  # here the batches report, finer
            progress.on_step(done, count, None)

    token = batch_listener.set(on_batch)
    try:
        values = map_documents(SYNTHESIZE_SHARD, [job.as_item() for job in jobs], on_done, progress.cancelled)
    except Cancelled as exc:
        raise BuildCancelled(str(exc)) from exc
    finally:
        batch_listener.reset(token)
    return [ShardDone(**value) for value in values]
