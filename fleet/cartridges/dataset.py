"""A self-study dataset on disk: synthesised conversations and their teacher targets, written
once and trained on for as many epochs as wanted.

A dataset is a directory of JSON Lines shards named ``{split}-{first:06d}-{end:06d}.jsonl``,
each holding conversations ``first .. end - 1`` of one split (``train`` or ``held_out``). A
shard's first line is its :class:`DatasetHeader` (the model, the corpus, the seed and the
self-study settings the conversations came from); every later line is one conversation:

``{"index", "seed_type", "span", "question", "prompt", "answer", "k", "ids", "probs"}``

where ``ids`` (int32) and ``probs`` (float32) are the (len(answer) + 1, k) teacher targets,
little-endian, base64. A conversation depends only on the header and its index, so shards can be
written anywhere (another process, another machine's Celery worker) and merged by copying them
into one directory; the same index written twice is the same conversation.

Writing is resumable: a shard is appended a batch at a time and flushed, an interrupted write
leaves at most one torn last line (dropped on reading), and writing a shard again synthesises
only the conversations it lacks. One shard has one writer at a time: two processes appending to
the same file can interleave their lines (give each worker its own range).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from inference.engine.engine import Engine
from inference.engine.training.distill import TeacherTargets

from .selfstudy import Conversation, SelfStudyConfig, plan_conversation, synthesize_batch

FORMAT = "lmserve-selfstudy/2"
SPLITS = ("train", "held_out")
HELD_OUT_SEED_OFFSET = 1_000_003  # held-out conversations come from a seed training never uses
SHARD_NAME = re.compile(r"^(train|held_out)-(\d{6,})-(\d{6,})\.jsonl$")


@dataclass(frozen=True)
class DatasetHeader:
    """What every conversation of a dataset was synthesised from; shards that disagree on any
    field are not one dataset."""

    format: str
    model: str  # the model's fingerprint, hex
    corpus_sha256: str  # of the corpus's token ids (int32, little-endian)
    corpus_tokens: int
    seed: int  # the train split's; the held-out split uses seed + HELD_OUT_SEED_OFFSET
    selfstudy: dict  # SelfStudyConfig's fields

    @classmethod
    def describe(
        cls, engine: Engine, corpus: Sequence[int], seed: int, config: SelfStudyConfig
    ) -> DatasetHeader:
        digest = hashlib.sha256(np.asarray(corpus, dtype="<i4").tobytes()).hexdigest()
        return cls(FORMAT, engine.fingerprint.hex(), digest, len(corpus), seed, asdict(config))

    def split_seed(self, split: str) -> int:
        return self.seed + (HELD_OUT_SEED_OFFSET if split == "held_out" else 0)

    def mismatch(self, other: DatasetHeader) -> str | None:
        """The first field on which ``other`` differs, or None."""
        for name, value in asdict(self).items():
            if asdict(other)[name] != value:
                return name
        return None


@dataclass(frozen=True)
class Record:
    """One stored conversation and its index in its split."""

    index: int
    conversation: Conversation


def _b64(array: np.ndarray, dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype=dtype).tobytes()).decode("ascii")


def _unb64(text: str, dtype: str, k: int) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=dtype).reshape(-1, k)


def encode_record(record: Record) -> str:
    conv = record.conversation
    return json.dumps(
        {
            "index": record.index,
            "seed_type": conv.seed_type,
            "span": list(conv.span),
            "question": conv.question,
            "prompt": list(conv.prompt),
            "answer": list(conv.answer),
            "k": int(conv.targets.ids.shape[1]),
            "ids": _b64(conv.targets.ids, "<i4"),
            "probs": _b64(conv.targets.probs, "<f4"),
        }
    )


def decode_record(line: str) -> Record:
    row = json.loads(line)
    k = row["k"]
    targets = TeacherTargets(
        _unb64(row["ids"], "<i4", k).astype(np.int64), _unb64(row["probs"], "<f4", k).astype(np.float32)
    )
    conv = Conversation(
        row["seed_type"],
        tuple(row["span"]),
        row["question"],
        tuple(row["prompt"]),
        tuple(row["answer"]),
        targets,
    )
    return Record(row["index"], conv)


def shard_path(directory: Path, split: str, first: int, end: int) -> Path:
    return directory / f"{split}-{first:06d}-{end:06d}.jsonl"


def _read_shard(path: Path, header: DatasetHeader) -> tuple[list[Record], int]:
    """The shard's complete records and the bytes they end at (a torn last line is left out);
    ValueError when its header is not ``header``."""
    data = path.read_bytes()
    if b"\n" not in data:
        return [], 0  # killed before its header was whole: a shard with nothing in it yet
    lines = data.split(b"\n")
    try:
        found = DatasetHeader(**json.loads(lines[0]))
    except (json.JSONDecodeError, TypeError) as exc:
        raise ValueError(
            f"{path.name}: not a self-study shard (its first line is no {FORMAT} header)"
        ) from exc
    field = header.mismatch(found)
    if field is not None:
        theirs, ours = asdict(found)[field], asdict(header)[field]
        raise ValueError(f"{path.name}: its {field} is {theirs!r}, this dataset's is {ours!r}")
    records, whole = [], len(lines[0]) + 1
    for line in lines[1:-1]:  # a line without its newline is never whole
        try:
            records.append(decode_record(line.decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, ValueError):
            break  # the torn tail of an interrupted write; everything before it is whole
        whole += len(line) + 1
    return records, whole


def load_split(directory: Path, header: DatasetHeader, split: str) -> dict[int, Conversation]:
    """Every conversation of ``split`` in the directory's shards, by index."""
    made: dict[int, Conversation] = {}
    for path in sorted(directory.glob(f"{split}-*.jsonl")):
        if SHARD_NAME.match(path.name):
            for record in _read_shard(path, header)[0]:
                made.setdefault(record.index, record.conversation)
    return made


def stored_settings(directory: Path) -> SelfStudyConfig | None:
    """The self-study settings a dataset's shards were synthesised with (read from the first
    shard's header line only), or None when the directory holds no shard with a header yet."""
    for path in sorted(directory.glob("*.jsonl")) if directory.is_dir() else ():
        if not SHARD_NAME.match(path.name):
            continue
        with path.open("rb") as fh:
            first = fh.readline()
        if first.endswith(b"\n"):
            try:
                return SelfStudyConfig(**json.loads(first)["selfstudy"])
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{path.name}: not a self-study shard (no {FORMAT} header)") from exc
    return None


BatchCallback = Callable[[int], None]


def write_shard(
    engine: Engine,
    corpus: Sequence[int],
    directory: Path,
    header: DatasetHeader,
    split: str,
    first: int,
    count: int,
    batch: int = 16,
    on_batch: BatchCallback | None = None,
) -> Path:
    """Synthesise conversations ``first .. first + count - 1`` of ``split`` into their shard,
    ``batch`` at a time (each batch decodes in lockstep, then is appended and flushed); those
    already in the shard are kept, not made again. ``on_batch(n)`` follows each batch."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {', '.join(SPLITS)}")
    config = SelfStudyConfig(**header.selfstudy)
    directory.mkdir(parents=True, exist_ok=True)
    path = shard_path(directory, split, first, first + count)
    have: set[int] = set()
    whole = 0
    if path.exists():
        records, whole = _read_shard(path, header)
        have = {r.index for r in records}
        os.truncate(path, whole)  # drop a torn tail, so appends start on a line of their own
    if not whole:
        path.write_text(json.dumps(asdict(header)) + "\n", encoding="utf-8")
    missing = [i for i in range(first, first + count) if i not in have]
    seed = header.split_seed(split)
    with path.open("a", encoding="utf-8") as out:
        for at in range(0, len(missing), batch):
            indices = missing[at : at + batch]
            plans = [plan_conversation(seed, i, len(corpus), config) for i in indices]
            made = synthesize_batch(engine, corpus, plans, config)
            out.writelines(encode_record(Record(i, c)) + "\n" for i, c in zip(indices, made, strict=True))
            out.flush()
            if on_batch is not None:
                on_batch(len(indices))
    return path
