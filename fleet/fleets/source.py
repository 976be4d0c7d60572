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
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

from fleet.cartridges.file import CartridgeFormatError, load_cartridge
from inference.engine.gguf_file import GGUFFile
from inference.engine.prefix import KVPrefix, PrefixMismatchError
from inference.kv.prefix_source import PrefixChoice

from .retrieval import LoadedFleet, Retriever, embed_text, query_text, should_switch

if TYPE_CHECKING:
    from inference.engine.engine import Engine
    from inference.types import GenerationRequest

QUERY_MAX_TOKENS = 1024  # a long conversation's query keeps its last tokens
REMEMBERED_CONVERSATIONS = 4096


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
    FleetFormatError when the directory is not a readable fleet."""

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

    # -- start-up ----------------------------------------------------------------------------
    def composed_rows_max(self) -> int:
        """The most prefix rows a composition can take (the rag_docs longest cartridges)."""
        rows = sorted((doc.rows for doc in self.fleet.manifest.documents), reverse=True)
        return sum(rows[: self.rag_docs])

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
        self._cartridge(engine, 0)

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
        elif self.adaptive and len(users) > 1:
            selection = self._adapt(engine, users, selection)
        self.conversations.put(identity, selection)
        return self.choice(engine, selection)

    def retrieve(self, engine: Engine, user_messages: list[str]) -> tuple[int, ...]:
        """The documents retrieval picks for these user messages (best first)."""
        self.retrievals += 1
        query = embed_text(engine, query_text(user_messages), QUERY_MAX_TOKENS)
        return self.retriever.select(query, self.rag_chunks, self.rag_docs).documents

    def _adapt(self, engine: Engine, user_messages: list[str], selection: tuple[int, ...]) -> tuple[int, ...]:
        self.retrievals += 1
        query = embed_text(engine, query_text(user_messages), QUERY_MAX_TOKENS)
        best = self.retriever.document_best(query, len(self.names))
        if not should_switch(best, selection, self.margin):
            return selection
        fresh = self.retriever.select(query, self.rag_chunks, self.rag_docs).documents
        self.switches += fresh != selection
        return fresh

    def choice(self, engine: Engine, selection: tuple[int, ...]) -> PrefixChoice:
        """The composed prefix of ``selection``; its key names the documents."""
        prefix = self.compositions.get_fresh(selection)
        if prefix is None:
            prefix = KVPrefix.concat([self._cartridge(engine, doc) for doc in selection])
            self.compositions.put(selection, prefix)
        names = tuple(self.names[doc] for doc in selection)
        return PrefixChoice("fleet:" + ",".join(names), prefix, names)

    def _cartridge(self, engine: Engine, doc: int) -> KVPrefix:
        prefix = self.cartridges.get_fresh(doc)
        if prefix is None:
            document = self.fleet.manifest.documents[doc]
            path = self.directory / document.cartridge
            try:
                cartridge = load_cartridge(path)
            except CartridgeFormatError as exc:
                raise PrefixMismatchError(f"--fleet {self.directory}: {exc}") from exc
            cartridge.check_model(engine.config.kv_geometry, engine.fingerprint, str(path))
            prefix = cartridge.prefix()
            self.cartridges.put(doc, prefix)
        return prefix
