"""The fleet app's KV prefix sources (inference.kv.prefix_source.PrefixSource).

``CartridgeSource`` serves one cartridge file behind every conversation (``lmserve --cartridge
F``, ``generate --cartridge F``). The server reaches it by its dotted path in the setting
``LMSERVE_PREFIX_SOURCES``, so `inference` never imports `fleet`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from inference.engine.engine import Engine
from inference.kv.prefix_source import PrefixChoice
from inference.types import GenerationRequest

from .cartridges.file import load_cartridge


def file_digest(path: Path) -> str:
    """The sha256 of a file's bytes (hex), read in blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class CartridgeSource:
    """One cartridge file as the prefix of every conversation. The file is read (and refused
    with CartridgeFormatError when it is not a cartridge) on construction; ``check`` compares
    its geometry and model fingerprint with the loaded model's."""

    def __init__(self, path: str | Path):
        self.path = Path(path).resolve()
        self.cartridge = load_cartridge(self.path)
        self.prefix = self.cartridge.prefix()
        # The key names the rows' content, so a sidecar of an earlier run restores only under
        # the very cartridge it was saved with.
        self.key = f"cartridge:{file_digest(self.path)[:32]}"
        self._choice = PrefixChoice(self.key, self.prefix)

    @property
    def rows(self) -> int:
        return self.cartridge.rows

    def check(self, engine: Engine) -> None:
        """Raise PrefixMismatchError, naming the file, when it was built for another model."""
        self.cartridge.check_model(engine.config.kv_geometry, engine.fingerprint, f"cartridge {self.path}")

    def choose(self, engine: Engine, request: GenerationRequest) -> PrefixChoice:
        return self._choice

    def describe(self) -> dict:
        """What GET /health says about the served cartridge."""
        return {"cartridge": {"path": str(self.path), "rows": self.rows}}
