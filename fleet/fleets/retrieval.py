"""Retrieval through the model itself: which documents' cartridges a conversation runs behind.

Chunks and queries embed by one contract (inference/engine/embedding.py: the text, then the
topic suffix tokenized on its own; the final-norm last hidden state, L2-normalised). The index
then centres every chunk on the chunk centroid and re-normalises (the all-but-the-top
correction: raw prompt embeddings share a large common direction that drowns the topic); a
query is centred on the same centroid. Selection is a cosine top-k over chunks, deduplicated
to documents in best-chunk order.

The adaptive rule (``--rag-adaptive``) is relative and anchored on every user message: a
conversation leaves its documents only when one outside them beats every selected document's
best chunk by ``margin``. A polite "thanks" or a runner-up flapping never crosses it; a clear
change of subject does.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inference.engine.embedding import embedding_tokens
from inference.engine.engine import Engine

from .format import FleetIndex, FleetManifest, read_index, read_manifest

EPS = 1e-12


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Every row scaled to length 1 (a zero row stays zero: it matches nothing)."""
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.maximum(norms, EPS)).astype(np.float32)


def centre(embeddings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(centred unit rows, centroid) of unit chunk embeddings (n, dim)."""
    centroid = embeddings.mean(axis=0).astype(np.float32)
    return unit_rows(embeddings - centroid), centroid


def embed_text(engine: Engine, text: str, max_tokens: int | None = None) -> np.ndarray:
    """The text's embedding by the contract (unit vector, not centred). ``max_tokens`` keeps
    only the text's last tokens (a long conversation's query stays affordable); the suffix is
    always whole."""
    tokens = embedding_tokens(engine.tokenizer, text)
    if max_tokens is not None and len(tokens) > max_tokens:
        bos = tokens[:1] if engine.tokenizer.add_bos else []
        tokens = bos + tokens[len(tokens) - max_tokens + len(bos) :]
    return engine.embed(tokens)


def query_text(user_messages: Iterable[str]) -> str:
    """The retrieval query of a conversation: its user messages, one per line."""
    return "\n".join(m for m in user_messages if m)


@dataclass(frozen=True)
class ChunkHit:
    chunk: int  # row of the index
    document: int  # manifest document index
    score: float  # cosine after centring


@dataclass(frozen=True)
class Selection:
    """The documents retrieval picked (best first) and the chunk hits behind them."""

    documents: tuple[int, ...]
    hits: tuple[ChunkHit, ...]


class Retriever:
    """Cosine top-k over a fleet's index (no engine inside: callers embed the query)."""

    def __init__(self, index: FleetIndex):
        self.index = index

    def centred(self, query: np.ndarray) -> np.ndarray:
        """A unit query embedding moved into the index's centred space."""
        return unit_rows((np.asarray(query, np.float32) - self.index.centroid)[None])[0]

    def scores(self, query: np.ndarray) -> np.ndarray:
        """Cosine of the (raw, unit) query against every chunk (n,)."""
        return self.index.embeddings @ self.centred(query)

    def select(
        self, query: np.ndarray, rag_chunks: int, rag_docs: int, exclude: Collection[int] = ()
    ) -> Selection:
        """The top ``rag_chunks`` chunks (ties: lower chunk first), deduplicated to at most
        ``rag_docs`` documents in best-chunk order. The chunks of the documents in ``exclude``
        (ones whose cartridges cannot be read) are not candidates."""
        scores = self.scores(query)
        candidates = np.flatnonzero(~np.isin(self.index.chunk_doc, list(exclude)))  # (m,) chunk rows
        order = candidates[np.argsort(-scores[candidates], kind="stable")[: max(1, rag_chunks)]]
        hits = tuple(ChunkHit(int(c), int(self.index.chunk_doc[c]), float(scores[c])) for c in order)
        documents: list[int] = []
        for hit in hits:
            if hit.document not in documents and len(documents) < rag_docs:
                documents.append(hit.document)
        return Selection(tuple(documents), hits)

    def document_best(self, query: np.ndarray, n_documents: int) -> np.ndarray:
        """Every document's best chunk score (n_documents,); -inf for one without chunks."""
        best = np.full(n_documents, -np.inf, np.float32)
        np.maximum.at(best, self.index.chunk_doc, self.scores(query))
        return best


def should_switch(best: np.ndarray, selected: Sequence[int], margin: float) -> bool:
    """The adaptive rule: some document outside ``selected`` beats the best of every selected
    document's best chunk by ``margin`` (cosine units)."""
    outside = np.delete(best, list(selected))
    if outside.size == 0:
        return False
    return bool(outside.max() >= best[list(selected)].max() + margin)


@dataclass(frozen=True)
class ScoredChunk:
    """A chunk of the "try a query" answer."""

    document: str
    chunk: int  # the chunk's ordinal within its document
    score: float


@dataclass(frozen=True)
class QueryResult:
    """What retrieval does with a text: the top chunks with their scores, the documents
    picked (selection order) and every document's best score."""

    query: str
    chunks: tuple[ScoredChunk, ...]
    documents: tuple[str, ...]
    document_scores: dict[str, float]


@dataclass(frozen=True, eq=False)
class LoadedFleet:
    """A fleet directory's manifest and index, read once."""

    directory: Path
    manifest: FleetManifest
    index: FleetIndex

    @classmethod
    def open(cls, directory: str | os.PathLike) -> LoadedFleet:
        manifest = read_manifest(directory)
        return cls(Path(directory), manifest, read_index(directory, manifest))


def try_query(
    fleet: str | os.PathLike | LoadedFleet, engine: Engine, text: str, rag_chunks: int = 8, rag_docs: int = 2
) -> QueryResult:
    """Embed ``text`` as a conversation's query and report what retrieval makes of it (the
    admin's "try a query" page). Raises FleetFormatError for a bad directory and ValueError
    for an empty text."""
    if not text.strip():
        raise ValueError("the query is empty")
    fleet = fleet if isinstance(fleet, LoadedFleet) else LoadedFleet.open(fleet)
    retriever = Retriever(fleet.index)
    query = embed_text(engine, text)
    selection = retriever.select(query, rag_chunks, rag_docs)
    names = fleet.manifest.names()
    first_chunk = {int(d): int(np.argmax(fleet.index.chunk_doc == d)) for d in set(fleet.index.chunk_doc)}
    chunks = tuple(
        ScoredChunk(names[h.document], h.chunk - first_chunk[h.document], h.score) for h in selection.hits
    )
    best = retriever.document_best(query, len(names))
    return QueryResult(
        text,
        chunks,
        tuple(names[d] for d in selection.documents),
        {name: float(best[i]) for i, name in enumerate(names)},
    )
