"""The layer code of each model family, one file per family; ``families.py`` maps GGUF
architectures to them together with the rest of each family's facts."""

from __future__ import annotations

from .base import DecoderModel
from .config import ModelConfig

__all__ = ["DecoderModel", "ModelConfig"]
