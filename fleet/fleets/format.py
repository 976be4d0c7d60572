"""The fleet directory: a manifest, a retrieval index and one cartridge per document.

A fleet built for one model lives in one directory::

    fleet.json          the manifest (:class:`FleetManifest`)
    index.safetensors   the retrieval index (:class:`FleetIndex`)
    doc-000.safetensors one cartridge per document (fleet/cartridges/file.py's format)

``fleet.json`` records the documents in build order (name, cartridge file, token count,
cartridge rows, optimizer steps, chunks in the index), p, the frozen prefix rows, the embedding
chunk length and dimension and the model fingerprint every file was made with.
``index.safetensors`` holds ``embeddings`` f32 ``[n, dim]`` (unit rows, centred on the chunk
centroid), ``centroid`` f32 ``[dim]`` and ``chunk_doc`` i64 ``[n]`` (the document of every
chunk, an index into the manifest's documents). Both are written atomically; readers raise
:class:`FleetFormatError` naming the file and what is wrong.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

MANIFEST_FILE = "fleet.json"
INDEX_FILE = "index.safetensors"
FORMAT = "lmserve-fleet/1"
INDEX_FORMAT = "lmserve-fleet-index/1"


class FleetFormatError(ValueError):
    """A fleet directory (or one of its files) is missing, unreadable or inconsistent."""


@dataclass(frozen=True)
class FleetDocument:
    """One document of the fleet and its cartridge."""

    name: str  # the source file's stem: what the x-lmserve-documents header says
    cartridge: str  # file name inside the fleet directory
    tokens: int  # the document's length in the model's tokens
    rows: int  # the cartridge's rows (p, or fewer for a shorter document)
    steps: int = 0  # optimizer steps the cartridge has taken
    chunks: int = 0  # its chunks in the retrieval index
    # With held-out selection: the step of the checkpoint the file holds, its held-out loss,
    # and the untrained initialisation's (None when the build held nothing out).
    kept_step: int | None = None
    held_out_loss: float | None = None
    held_out_initial: float | None = None


@dataclass(frozen=True)
class FleetManifest:
    """What ``fleet.json`` says."""

    model_fingerprint: str  # hex of the model's 16-byte fingerprint
    model: str  # the GGUF's file name when built (informative; the fingerprint decides)
    p: int  # the prefix tokens asked for per document
    frozen_rows: int
    embed_chunk: int  # tokens per retrieval chunk
    embed_dim: int  # the model's hidden size: the embeddings' length
    documents: tuple[FleetDocument, ...] = ()
    steps: int = 0  # joint-training steps of the build
    format: str = FORMAT
    training: dict = field(default_factory=dict)

    @property
    def fingerprint(self) -> bytes:
        return bytes.fromhex(self.model_fingerprint)

    def names(self) -> list[str]:
        return [doc.name for doc in self.documents]

    def as_json(self) -> str:
        data = asdict(self)
        # Fields a build did not fill are left out: a reader of the same format version from
        # before they existed refuses keys it does not know.
        data["documents"] = [
            {key: value for key, value in asdict(doc).items() if value is not None} for doc in self.documents
        ]
        return json.dumps(data, indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True, eq=False)
class FleetIndex:
    """Chunk embeddings of every document, centred on their centroid (see retrieval.py)."""

    embeddings: np.ndarray  # (n, dim) float32, unit rows after centring
    centroid: np.ndarray  # (dim,) float32
    chunk_doc: np.ndarray  # (n,) int64: manifest document index of every chunk

    @property
    def dim(self) -> int:
        return int(self.centroid.shape[0])

    def __len__(self) -> int:
        return int(self.chunk_doc.shape[0])


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_manifest(directory: str | os.PathLike, manifest: FleetManifest) -> Path:
    """Write ``fleet.json`` atomically."""
    path = Path(directory) / MANIFEST_FILE
    _atomic_write(path, lambda tmp: tmp.write_text(manifest.as_json(), encoding="utf-8"))
    return path


def write_index(directory: str | os.PathLike, index: FleetIndex, fingerprint_hex: str) -> Path:
    """Write ``index.safetensors`` atomically."""
    path = Path(directory) / INDEX_FILE
    tensors = {
        "embeddings": np.ascontiguousarray(index.embeddings, np.float32),
        "centroid": np.ascontiguousarray(index.centroid, np.float32),
        "chunk_doc": np.ascontiguousarray(index.chunk_doc, np.int64),
    }
    metadata = {"format": INDEX_FORMAT, "model_fingerprint": fingerprint_hex}
    _atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    return path


def read_manifest(directory: str | os.PathLike) -> FleetManifest:
    """Read ``fleet.json``; FleetFormatError names the file and the problem."""
    directory = Path(directory)
    path = directory / MANIFEST_FILE
    if not directory.is_dir():
        raise FleetFormatError(f"{directory}: no such fleet directory")
    if not path.is_file():
        raise FleetFormatError(f"{directory}: not a fleet directory (no {MANIFEST_FILE})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FleetFormatError(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise FleetFormatError(f"{path}: not a fleet manifest (format {found!r}, expected {FORMAT!r})")
    try:
        documents = tuple(FleetDocument(**doc) for doc in data.pop("documents"))
        manifest = FleetManifest(documents=documents, **data)
        bytes.fromhex(manifest.model_fingerprint)
    except (KeyError, TypeError, ValueError) as exc:
        raise FleetFormatError(f"{path}: incomplete or inconsistent manifest ({exc})") from exc
    if not documents:
        raise FleetFormatError(f"{path}: the manifest lists no documents")
    names = manifest.names()
    if len(set(names)) != len(names):
        raise FleetFormatError(f"{path}: document names repeat")
    return manifest


def read_index(directory: str | os.PathLike, manifest: FleetManifest) -> FleetIndex:
    """Read ``index.safetensors`` (memory-mapped by safetensors) and check it against the
    manifest: same model, same dimension, every chunk naming a listed document."""
    path = Path(directory) / INDEX_FILE
    if not path.is_file():
        raise FleetFormatError(f"{path}: the fleet has no retrieval index")
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            embeddings, centroid, chunk_doc = (
                f.get_tensor(n) for n in ("embeddings", "centroid", "chunk_doc")
            )
    except (OSError, ValueError, SafetensorError) as exc:
        raise FleetFormatError(f"{path}: not a readable index ({exc})") from exc
    if meta.get("format") != INDEX_FORMAT:
        raise FleetFormatError(f"{path}: not a fleet index (format {meta.get('format')!r})")
    if meta.get("model_fingerprint") != manifest.model_fingerprint:
        raise FleetFormatError(f"{path}: built for another model than the manifest says")
    n = chunk_doc.shape[0] if chunk_doc.ndim == 1 else -1
    if embeddings.shape != (n, manifest.embed_dim) or centroid.shape != (manifest.embed_dim,):
        raise FleetFormatError(
            f"{path}: shapes embeddings {embeddings.shape}, centroid {centroid.shape}, chunk_doc "
            f"{chunk_doc.shape} do not fit {manifest.embed_dim}-dimensional embeddings"
        )
    if n == 0 or chunk_doc.min() < 0 or chunk_doc.max() >= len(manifest.documents):
        raise FleetFormatError(f"{path}: chunks name documents the manifest does not list (or none)")
    return FleetIndex(embeddings.astype(np.float32), centroid.astype(np.float32), chunk_doc.astype(np.int64))
