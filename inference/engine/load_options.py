"""How a model's weights are read from its GGUF file (chosen by the caller at load time)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ExpertMode(StrEnum):
    """Where a mixture-of-experts model's routed expert matrices live.

    ``repack``: every expert is converted at load into the layout the integer kernels read
    (fast products, RAM for all experts, a slower load). ``borrow``: experts stay in the
    memory-mapped file; a forward converts only the experts its router picked (fast load, RAM
    only for the pages touched and a small cache of converted experts)."""

    REPACK = "repack"
    BORROW = "borrow"


@dataclass(frozen=True)
class LoadOptions:
    """Choices about reading the file that do not change what the model computes."""

    experts: ExpertMode = ExpertMode.REPACK
    # Converted experts kept per expert tensor in borrow mode (least recently used dropped).
    expert_cache: int = 16
