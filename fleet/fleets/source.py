"""``FleetSource``: the prefix of every conversation, retrieved from a fleet (``--fleet DIR``).

Selection is sticky per conversation. A conversation is known by its first user message
(every request carries the whole history, and token prefixes alone cannot tell two short
conversations apart behind the same template preamble); its documents are remembered, so a
continuation keeps its prefix and the slot's cached rows, and retrieval runs only for a
conversation not remembered. With ``adaptive``, a follow-up re-embeds all its user messages
and switches documents only by the margin rule (retrieval.should_switch).

Parsed cartridges sit in a small LRU (their files are read through safetensors' memory map);
a composition concatenates the selected documents' rows in selection order. The choice's key
names the selection, so the worker reuses a slot's rows only behind the same documents.

Every document's cartridge is read once on construction (format, finite rows, the manifest's
model fingerprint and row count, one geometry for all), so a fleet with a bad file is refused
at start-up naming it. A file that fails to read later (changed on disk while serving) is
skipped: one log line, the reply composed from the rest of the selection, and the document
left out of retrieval until the server restarts.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fleet.cartridges.file import CartridgeFormatError, load_cartridge
from inference.engine.gguf_file import GGUFFile
from inference.engine.kv_cache import KVGeometry
from inference.engine.prefix import KVPrefix, PrefixMismatchError
from inference.kv.prefix_source import PrefixChoice

from .format import FleetFormatError
from .retrieval import LoadedFleet, Retriever, embed_text, query_text, should_switch

if TYPE_CHECKING:
    from inference.engine.engine import Engine
    from inference.types import GenerationRequest

QUERY_MAX_TOKENS = 1024  # a long conversation's query keeps its last tokens
REMEMBERED_CONVERSATIONS = 4096

logger = logging.getLogger("lmserve.fleet")


class FleetDocumentError(FleetFormatError):
    """A document's cartridge cannot be served: unreadable, not finite, made for another model,
    or not what the manifest says (the message names the document and its file)."""


class LRU(OrderedDict):
    """An ordered dict that forgets its least recently used entries beyond ``capacity``."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity

    def get_fresh(self, key):
        if key in self:
            self.move_to_end(key)
            return self[key]
        return None

    def put(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.capacity:
            self.popitem(last=False)


class FleetSource:
    """Implements inference.kv.prefix_source.PrefixSource over a fleet directory. Raises
    FleetFormatError when the directory is not a readable fleet, and FleetDocumentError
    (naming the file) when one of its documents' cartridges is not servable."""

    def __init__(
        self,
        directory: str | os.PathLike,
        rag_docs: int = 2,
        rag_chunks: int = 8,
        adaptive: bool = False,
        margin: float = 0.05,
        resident: int | None = None,
    ):
        if rag_docs < 1 or rag_chunks < 1:
            raise ValueError("--rag-docs and --rag-chunks must be at least 1")
        self.directory = Path(directory)
        self.fleet = LoadedFleet.open(self.directory)
        self.retriever = Retriever(self.fleet.index)
        self.rag_docs, self.rag_chunks = rag_docs, rag_chunks
        self.adaptive, self.margin = adaptive, margin
        self.names = tuple(self.fleet.manifest.names())
        self.cartridges = LRU(max(resident or 4, rag_docs))  # document -> KVPrefix
        self.compositions = LRU(2)  # selection -> KVPrefix
        self.conversations = LRU(REMEMBERED_CONVERSATIONS)  # identity digest -> selection
        self.retrievals = 0  # retrieval passes run (first turns and adaptive re-embeddings)
        self.switches = 0
        self.unreadable: set[int] = set()  # documents whose file failed to read while serving
        self.geometry = self._verify_documents()

    def _verify_documents(self) -> KVGeometry:
        """Read every document's cartridge once (then let it go: the LRU fills as conversations
        ask), so that a bad file stops the start-up instead of failing every request that
        retrieves it. Returns the KV geometry they share."""
        geometry = self._read(0).geometry
        for doc in range(1, len(self.names)):
            self._read(doc, geometry, f"document {self.names[0]!r}'s")
        return geometry

    # -- start-up ----------------------------------------------------------------------------
    def composed_rows_max(self) -> int:
        """The most prefix rows a composition can take (the rag_docs longest cartridges)."""
        rows = sorted((doc.rows for doc in self.fleet.manifest.documents), reverse=True)
        return sum(rows[: self.rag_docs])

    def serving_bytes(self) -> int:
        """The most memory the source holds while serving (float32 rows): its cache of read
        cartridges, full of the longest ones, and its cache of compositions, full of the
        largest. Nothing of it is held at start-up, so the KV RAM guard sets it aside."""
        per_row = self.geometry.bytes_per_position(4)
        rows = sorted((doc.rows for doc in self.fleet.manifest.documents), reverse=True)
        cartridges = sum(rows[: self.cartridges.capacity]) * per_row
        return cartridges + self.compositions.capacity * self.composed_rows_max() * per_row

    def check_model_file(self, model_path: str | os.PathLike) -> None:
        """Refuse a model other than the one the fleet was built for, from the GGUF file alone
        (before the server starts loading it)."""
        from inference.engine.fingerprint import model_fingerprint

        self._check_fingerprint(model_fingerprint(GGUFFile(model_path)), Path(model_path).name)

    def check(self, engine: Engine) -> None:
        """The loaded model must be the fleet's (fingerprint), its hidden size the index's and
        its KV geometry the cartridges'."""
        self._check_fingerprint(engine.fingerprint, engine.model_id)
        manifest = self.fleet.manifest
        if manifest.embed_dim != engine.config.n_embd:
            raise PrefixMismatchError(
                f"--fleet {self.directory}: its index holds {manifest.embed_dim}-dimensional embeddings, "
                f"the model's hidden size is {engine.config.n_embd}"
            )
        if self.geometry != engine.config.kv_geometry:
            raise PrefixMismatchError(
                f"--fleet {self.directory}: its cartridges' KV geometry {self.geometry} does not match "
                f"the model's {engine.config.kv_geometry}"
            )

    def _check_fingerprint(self, fingerprint: bytes, model_name: str) -> None:
        manifest = self.fleet.manifest
        if fingerprint != manifest.fingerprint:
            raise PrefixMismatchError(
                f"--fleet {self.directory}: built for another model ({manifest.model}, fingerprint "
                f"{manifest.model_fingerprint}); {model_name}'s fingerprint is {fingerprint.hex()}"
            )

    # -- per request -------------------------------------------------------------------------
    def choose(self, engine: Engine, request: GenerationRequest) -> PrefixChoice:
        """The remembered documents of this conversation, retrieved for a new one (and, when
        adaptive, switched on a decisive change of subject), composed in selection order."""
        users = [m.content for m in request.messages if m.role == "user"]
        if not users:  # nothing a user said: the whole conversation is the query
            users = [m.content for m in request.messages]
        if request.raw is not None:  # a raw prompt (legacy completions) is its own query
            users = [request.raw.text or " "]
        identity = hashlib.blake2b(users[0].encode("utf-8", "surrogatepass"), digest_size=16).digest()
        selection = self.conversations.get_fresh(identity)
        if selection is None:
            selection = self.retrieve(engine, users)
        elif self.adaptive and len(users) > 1 and selection:  # () when nothing could be read
            selection = self._adapt(engine, users, selection)
        selection, prefix = self._compose(engine, selection)
        while not selection:  # every document it ran behind failed to read: pick among the rest
            picked = self.retrieve(engine, users)
            if not picked:
                break  # nothing readable is left to retrieve: no prefix at all
            selection, prefix = self._compose(engine, picked)  # each failed pick is left out next
        self.conversations.put(identity, selection)
        return self._choice(selection, prefix)

    def retrieve(self, engine: Engine, user_messages: list[str]) -> tuple[int, ...]:
        """The documents retrieval picks for these user messages (best first), among those whose
        cartridges can be read."""
        self.retrievals += 1
        query = embed_text(engine, query_text(user_messages), QUERY_MAX_TOKENS)
        return self.retriever.select(query, self.rag_chunks, self.rag_docs, self.unreadable).documents

    def _adapt(self, engine: Engine, user_messages: list[str], selection: tuple[int, ...]) -> tuple[int, ...]:
        self.retrievals += 1
        query = embed_text(engine, query_text(user_messages), QUERY_MAX_TOKENS)
        best = self.retriever.document_best(query, len(self.names))
        best[list(self.unreadable)] = -np.inf  # a document that cannot be served wins nothing
        if not should_switch(best, selection, self.margin):
            return selection
        fresh = self.retriever.select(query, self.rag_chunks, self.rag_docs, self.unreadable).documents
        self.switches += fresh != selection
        return fresh

    def _choice(self, selection: tuple[int, ...], prefix: KVPrefix) -> PrefixChoice:
        """The choice of ``selection`` composed as ``prefix``; its key names the documents."""
        names = tuple(self.names[doc] for doc in selection)
        return PrefixChoice("fleet:" + ",".join(names), prefix, names)

    def _compose(self, engine: Engine, selection: tuple[int, ...]) -> tuple[tuple[int, ...], KVPrefix]:
        """The documents of ``selection`` that can be read, and their rows one after another
        (none at all when no document is left: the conversation runs behind no prefix)."""
        while True:
            selection = tuple(doc for doc in selection if doc not in self.unreadable)
            prefix = self.compositions.get_fresh(selection)
            if prefix is not None:
                return selection, prefix
            parts = [self._cartridge(engine, doc) for doc in selection]
            if None in parts:
                continue  # a document just failed to read (now unreadable): compose the rest
            prefix = KVPrefix.concat(parts) if parts else KVPrefix.empty(self.geometry)
            self.compositions.put(selection, prefix)
            return selection, prefix

    def _cartridge(self, engine: Engine, doc: int) -> KVPrefix | None:
        """The document's rows, from the LRU or its file; None (logged once, the document then
        left out) when the file no longer reads as the cartridge verified at start-up."""
        prefix = self.cartridges.get_fresh(doc)
        if prefix is None:
            try:
                prefix = self._read(doc, engine.config.kv_geometry, "the model's")
            except FleetDocumentError as exc:
                self.unreadable.add(doc)
                logger.warning("%s; skipping it until the server restarts", exc)
                return None
            self.cartridges.put(doc, prefix)
        return prefix

    def _read(self, doc: int, geometry: KVGeometry | None = None, whose: str = "") -> KVPrefix:
        """Read document ``doc``'s cartridge and hold it to the manifest (the model fingerprint,
        the rows) and to ``geometry`` (when given: ``whose`` it is, for the message);
        FleetDocumentError names the document, its file and what is wrong."""
        document = self.fleet.manifest.documents[doc]
        path = self.directory / document.cartridge
        where = f"--fleet {self.directory}: document {document.name!r}"
        try:
            cartridge = load_cartridge(path)
        except CartridgeFormatError as exc:
            raise FleetDocumentError(f"{where}: {exc}") from exc
        manifest = self.fleet.manifest
        if cartridge.fingerprint != manifest.fingerprint:
            raise FleetDocumentError(
                f"{where}: {path}: built for the model with fingerprint {cartridge.fingerprint.hex()}, "
                f"but the fleet's ({manifest.model}) is {manifest.model_fingerprint}"
            )
        if cartridge.rows != document.rows:
            raise FleetDocumentError(
                f"{where}: {path}: holds {cartridge.rows} rows, the manifest says {document.rows}"
            )
        if geometry is not None and cartridge.geometry != geometry:
            raise FleetDocumentError(
                f"{where}: {path}: KV geometry {cartridge.geometry} does not match {whose} {geometry}"
            )
        return cartridge.prefix()
