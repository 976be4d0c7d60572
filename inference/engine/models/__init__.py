"""Model families by GGUF ``general.architecture``; one file per family."""

from __future__ import annotations

from ..gguf_file import GGUFError, GGUFFile
from .base import DecoderModel
from .config import ModelConfig
from .gemma3 import Gemma3Model
from .llama import LlamaModel
from .qwen2 import Qwen2Model
from .qwen3 import Qwen3Model
from .qwen3moe import Qwen3MoeModel

FAMILIES: dict[str, type[DecoderModel]] = {
    "llama": LlamaModel,
    "qwen2": Qwen2Model,
    "qwen3": Qwen3Model,
    "qwen3moe": Qwen3MoeModel,
    "gemma3": Gemma3Model,
}


def load_model(f: GGUFFile) -> DecoderModel:
    """Build the family named by the file's ``general.architecture``."""
    arch = f.architecture
    family = FAMILIES.get(arch)
    if family is None:
        supported = ", ".join(sorted(FAMILIES))
        raise GGUFError(f"{f.path}: architecture {arch!r} is not supported (supported: {supported})")
    return family(f)


__all__ = ["FAMILIES", "DecoderModel", "ModelConfig", "load_model"]
