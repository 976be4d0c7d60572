"""The disk tier of the slot pool (``--kv-cache-dir``, ``--kv-disk-slots``).

A resident slot about to be overwritten by an unrelated request spills to a sidecar file; a
later request that matches a file better than every resident slot restores it with no
re-prefill. Files are reused least recently used first (their modification time is their last
use, so the order survives a restart) and a conversation is never stored twice: a slot whose
tokens a file already holds is skipped, and a slot that continues a file extends it in place.
A slot behind a KV prefix stores the prefix's rows and key with it (see sidecar.py) and matches
only requests behind the prefix of the same key.

``--kv-disk-slots`` counts files, and a file being written counts under its temporary name:
room is made (the least recently used file deleted) before a new file's temporary is created,
and a write that fails removes its temporary. A server killed mid-write leaves one behind;
the next start-up removes the temporaries of the names this store makes (``.<uuid hex>.kv.tmp``,
nothing else) with a log line. The directory belongs to one server: two sharing it would evict,
and clean up, each other's files.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from inference.engine.kv_cache import KVCache, KVGeometry
from inference.kv.sidecar import (
    DTYPE_NAMES,
    F16,
    SidecarError,
    append_sidecar,
    load_into,
    open_sidecar,
    sidecar_tokens,
    write_sidecar,
)

logger = logging.getLogger("lmserve.kv_disk")
SUFFIX = ".kv"
# The temporary (sidecar.temporary_path) of a file this store names (uuid4().hex + SUFFIX): the
# only kind of file it removes unasked.
OWN_TEMPORARY = re.compile(r"\.[0-9a-f]{32}\.kv\.tmp")


@dataclass
class StoredSlot:
    """One sidecar file this server may restore."""

    path: Path
    tokens: list[int]  # the real tokens, past the prefix rows
    last_used: float
    prefix_key: str = ""  # the key of the prefix the tokens follow

    def common_prefix(self, prompt: list[int], key: str = "") -> int:
        """Tokens shared with ``prompt`` behind the prefix ``key`` (0 behind another)."""
        if key != self.prefix_key:
            return 0
        n = min(len(self.tokens), len(prompt))
        for i in range(n):
            if self.tokens[i] != prompt[i]:
                return i
        return n


def scan_sidecars(directory: Path) -> list[dict]:
    """Every sidecar in ``directory`` as plain data (path, geometry, dtype, tokens, size, last
    use), unreadable ones with an ``error`` instead: what the admin pages show."""
    found = []
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        stat = path.stat()
        entry = {"name": path.name, "path": str(path), "bytes": stat.st_size, "last_used": stat.st_mtime}
        try:
            header, records = open_sidecar(path)
        except (SidecarError, OSError, ValueError) as exc:
            entry["error"] = str(exc)
        else:
            g = header.geometry
            entry["geometry"] = f"{g.n_layers}x{g.n_kv_heads}x{g.head_dim_k}/{g.head_dim_v}"
            entry["dtype"] = DTYPE_NAMES[header.dtype]
            entry["tokens"] = max(0, header.count - header.prefix_rows)
            entry["prefix_rows"] = header.prefix_rows
            entry["prefix_key"] = header.prefix_key
            entry["model"] = header.fingerprint.hex()
            del records
        found.append(entry)
    return found


class SidecarStore:
    """The sidecar files under ``directory`` written by this model (``fingerprint``, see
    inference.engine.fingerprint) for caches of this geometry."""

    def __init__(
        self, directory: Path, max_files: int, geometry: KVGeometry, fingerprint: bytes, dtype: int = F16
    ):
        if max_files < 1:
            raise ValueError(f"need room for at least one sidecar file, got {max_files}")
        self.directory = directory
        self.max_files = max_files
        self.geometry = geometry
        self.fingerprint = fingerprint
        self.dtype = dtype
        directory.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temporaries()
        self.files: list[StoredSlot] = []
        for path in sorted(directory.glob(f"*{SUFFIX}")):
            stored = self._adopt(path)
            if stored is not None:
                self.files.append(stored)
        if self.files:
            logger.info("found %d KV sidecar file(s) in %s", len(self.files), directory)

    def _remove_stale_temporaries(self) -> None:
        """Delete the temporaries a write interrupted by a kill left (no write of this store
        is under way yet), with one log line; they are outside the budget, and nothing ever
        renames them."""
        stale = [p for p in self.directory.iterdir() if OWN_TEMPORARY.fullmatch(p.name) and p.is_file()]
        if not stale:
            return
        removed = 0
        for path in stale:
            removed += path.stat().st_size
            path.unlink(missing_ok=True)
        logger.warning(
            "removed %d stale KV sidecar temporar%s (%d bytes) left by an interrupted spill in %s: %s",
            len(stale),
            "y" if len(stale) == 1 else "ies",
            removed,
            self.directory,
            ", ".join(sorted(p.name for p in stale)),
        )

    def _adopt(self, path: Path) -> StoredSlot | None:
        """A file left by an earlier run, or None (logged) when it cannot be used."""
        try:
            header, records = open_sidecar(path)
        except (SidecarError, OSError, ValueError) as exc:
            logger.warning("ignoring KV sidecar %s: %s", path.name, exc)
            return None
        if header.geometry != self.geometry:
            logger.info("ignoring KV sidecar %s: geometry %s is not this model's", path.name, header.geometry)
            return None
        if header.fingerprint != self.fingerprint:
            logger.info(
                "ignoring KV sidecar %s: written by another model (fingerprint %s, this model's %s)",
                path.name,
                header.fingerprint.hex(),
                self.fingerprint.hex(),
            )
            return None
        if records is None:
            logger.info("ignoring KV sidecar %s: no complete record", path.name)
            return None
        tokens = sidecar_tokens(records, header)
        return StoredSlot(path, tokens, path.stat().st_mtime, header.prefix_key)

    def best_match(self, prompt: list[int], key: str = "") -> tuple[StoredSlot | None, int]:
        """The file behind the prefix ``key`` sharing the longest token prefix with ``prompt``,
        and that length."""
        best, shared = None, 0
        for stored in self.files:
            n = stored.common_prefix(prompt, key)
            if n > shared:
                best, shared = stored, n
        return best, shared

    def holds(self, tokens: list[int], key: str = "") -> bool:
        """Whether some file behind the prefix ``key`` already contains ``tokens`` as a prefix
        of its own."""
        return any(s.common_prefix(tokens, key) == len(tokens) for s in self.files)

    def spill(self, cache: KVCache, keep: StoredSlot | None = None) -> Path | None:
        """Store ``cache``'s positions unless a file already holds them; the file written.
        ``keep`` (a file about to be restored) is never evicted to make room: when it is the
        only candidate, nothing is spilled."""
        tokens, key = cache.tokens, cache.prefix_key
        if not tokens or self.holds(tokens, key):
            return None
        extended = next(
            (s for s in self.files if s.prefix_key == key and s.tokens == tokens[: len(s.tokens)]), None
        )
        if extended is not None:
            append_sidecar(extended.path, cache)
            extended.tokens = list(tokens)
            self._touch(extended)
            return extended.path
        while len(self.files) >= self.max_files:  # room first: the new file's temporary is one of them
            evictable = [s for s in self.files if s is not keep]
            if not evictable:
                logger.info("not spilling a %d-token KV slot: the only file is being restored", len(tokens))
                return None
            self.delete(min(evictable, key=lambda s: s.last_used).path)
        path = self.directory / f"{uuid.uuid4().hex}{SUFFIX}"
        write_sidecar(path, cache, self.fingerprint, self.dtype)
        stored = StoredSlot(path, list(tokens), 0.0, key)
        self._touch(stored)
        self.files.append(stored)
        logger.info("spilled a %d-token KV slot to %s", len(tokens), path.name)
        return path

    def restore(self, stored: StoredSlot, cache: KVCache) -> bool:
        """Load a file into ``cache``; False (the file dropped) when it became unusable. A
        damaged file (rows failing their checksum) is deleted: it can never be used again."""
        try:
            header, records = open_sidecar(stored.path)
            if records is None or header.geometry != self.geometry or header.fingerprint != self.fingerprint:
                raise SidecarError("no usable records left")
            load_into(records, header, cache)
        except (SidecarError, OSError, ValueError) as exc:
            logger.warning("cannot restore KV sidecar %s: %s", stored.path.name, exc)
            cache.truncate(0)  # rows may be half-loaded: the cache must not claim any
            self.files.remove(stored)
            if isinstance(exc, SidecarError):
                stored.path.unlink(missing_ok=True)
            return False
        stored.tokens = list(cache.tokens)
        self._touch(stored)
        logger.info("restored a %d-token KV slot from %s", cache.n_tokens, stored.path.name)
        return True

    def delete(self, path: Path) -> bool:
        """Forget and remove one file; False when it was not one of ours."""
        for stored in self.files:
            if stored.path == path:
                self.files.remove(stored)
                path.unlink(missing_ok=True)
                return True
        return False

    def _touch(self, stored: StoredSlot) -> None:
        now = time.time()
        stored.last_used = max(now, max((s.last_used for s in self.files), default=0.0) + 1e-3)
        os.utime(stored.path, (stored.last_used, stored.last_used))
