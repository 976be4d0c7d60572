"""The seam between serving and whatever supplies KV prefixes (DESIGN.md: ``PrefixSource``).

`inference` never imports `fleet`: the `fleet` app implements these protocols (one cartridge
for every conversation, or a fleet's per-request retrieval and composition) and the server
hands the worker an instance. The worker asks once per request which prefix the conversation
runs behind, and installs it in the slot's cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from inference.engine.prefix import KVPrefix

if TYPE_CHECKING:
    from inference.engine.engine import Engine
    from inference.types import GenerationRequest


@dataclass(frozen=True, eq=False)
class PrefixChoice:
    """The prefix a request runs behind.

    ``key`` identifies the composed prefix: two requests share cached rows only when their keys
    are equal (a slot remembers the key it was filled under). ``documents`` are the fleet
    documents composed, in selection order (empty for a single cartridge)."""

    key: str
    prefix: KVPrefix
    documents: tuple[str, ...] = ()


class PrefixSource(Protocol):
    """Supplies the prefix of every conversation the worker serves.

    A source may also have ``describe() -> dict``: entries merged into GET /health (the
    cartridge source reports ``{"cartridge": {"path": ..., "rows": ...}}``); and
    ``serving_bytes() -> int``: the memory it will hold while serving and does not hold at
    start-up (a fleet's caches of cartridges and compositions), which the KV RAM guard sets
    aside."""

    def check(self, engine: Engine) -> None:
        """Called once after the model loads: raise PrefixMismatchError (a clear message naming
        the file and what differs) when the source was built for another model or geometry."""

    def choose(self, engine: Engine, request: GenerationRequest) -> PrefixChoice:
        """The prefix for this request (runs on the worker thread: it may embed with the engine)."""


def load_prefix_source(factory: str, argument: str) -> PrefixSource:
    """``factory`` (a dotted path to a callable, e.g. a PrefixSource class) called with
    ``argument`` (a file or directory). Raises ImportError for a factory that cannot be found,
    and whatever the factory raises for an argument it refuses (OSError, ValueError)."""
    from django.utils.module_loading import import_string

    return import_string(factory)(argument)
