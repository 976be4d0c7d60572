"""Building a cartridge from a corpus: the one function the command and the Celery task run.

``build_cartridge`` tokenizes the corpus, initialises the cartridge from the model's own K/V of
its first p tokens (BOS included when the model adds one) and, with ``steps > 0``, trains it by
self-study context distillation (``fleet.cartridges.train``). Progress, the running loss and
cancellation go through a :class:`BuildProgress` the caller supplies (tqdm for the command, the
job row for Celery), so the function knows nothing about either.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from inference.engine.engine import Engine

from .file import Cartridge, save_cartridge
from .init import initial_cartridge
from .selfstudy import SelfStudyConfig
from .train import TrainConfig, TrainingCancelled, train_cartridge


class BuildCancelled(Exception):
    """The caller asked the build to stop; nothing was written."""


class BuildProgress(Protocol):
    """Where a build reports while it runs."""

    def on_step(self, step: int, total: int, loss: float | None) -> None: ...

    def on_log(self, message: str) -> None: ...

    def cancelled(self) -> bool: ...


class SilentProgress:
    """Reports nowhere and never cancels."""

    def on_step(self, step: int, total: int, loss: float | None) -> None:
        pass

    def on_log(self, message: str) -> None:
        pass

    def cancelled(self) -> bool:
        return False


@dataclass(frozen=True)
class CartridgeBuildSpec:
    """What to build; the fields of ``manage.py build_cartridge``."""

    corpus: Path  # a UTF-8 text file
    out: Path  # the cartridge file to write
    model: Path  # the GGUF the cartridge is for
    prefix_tokens: int = 256  # p: rows of the cartridge
    steps: int = 0  # optimizer steps; 0 writes the untrained initialisation
    lr: float = 2e-3  # the paper's 2e-2 assumes far larger steps (train.TrainConfig)
    seed: int = 0
    frozen_rows: int = 1  # leading rows excluded from training (the attention sink)
    accum: int = 4  # self-study conversations per optimizer step
    checkpoint: bool = False  # recompute per layer in the backward: less memory, more time
    selfstudy: SelfStudyConfig = field(default_factory=SelfStudyConfig)  # span and reply lengths


@dataclass(frozen=True)
class CartridgeBuildResult:
    """The summary the command prints as its last line (JSON)."""

    path: str
    rows: int
    steps: int
    loss_first: float | None  # held-out distillation loss before training
    loss_last: float | None  # ... and after
    seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


def corpus_tokens(engine: Engine, corpus: Path) -> list[int]:
    """The corpus as the model's tokens (BOS first when the model adds one; text never
    becomes control tokens)."""
    text = corpus.read_text(encoding="utf-8")
    if not text.strip():
        raise ValueError(f"{corpus}: the corpus is empty")
    return engine.tokenizer.encode(text, add_bos=engine.tokenizer.add_bos, parse_special=False)


def build_cartridge(
    spec: CartridgeBuildSpec, progress: BuildProgress | None = None, engine: Engine | None = None
) -> CartridgeBuildResult:
    """Build and write the cartridge ``spec`` describes; raises ValueError on bad input and
    BuildCancelled when ``progress.cancelled()`` turns true (the output is then not written)."""
    progress = progress or SilentProgress()
    t0 = time.perf_counter()
    engine = engine or Engine.load(spec.model)
    tokens = corpus_tokens(engine, spec.corpus)
    if spec.prefix_tokens < 1 or spec.prefix_tokens > len(tokens):
        raise ValueError(
            f"--prefix-tokens {spec.prefix_tokens} must be within 1..{len(tokens)} (the corpus's tokens)"
        )
    provenance = {"corpus": spec.corpus.name, "corpus_tokens": len(tokens), "seed": spec.seed, "lr": spec.lr}
    cartridge = initial_cartridge(engine, tokens[: spec.prefix_tokens], spec.frozen_rows, provenance)
    loss_first = loss_last = None
    if spec.steps < 0:
        raise ValueError(f"--steps {spec.steps} must be 0 or more")
    if spec.steps > 0:
        cartridge, loss_first, loss_last = _train(engine, spec, cartridge, tokens, progress)
    if progress.cancelled():
        raise BuildCancelled("cancelled before writing")
    save_cartridge(spec.out, cartridge)
    return CartridgeBuildResult(
        str(spec.out), cartridge.rows, spec.steps, loss_first, loss_last, time.perf_counter() - t0
    )


def _train(
    engine: Engine, spec: CartridgeBuildSpec, cartridge: Cartridge, tokens: list[int], progress: BuildProgress
) -> tuple[Cartridge, float, float]:
    """Self-study training of the initial cartridge; the held-out losses before and after."""
    config = TrainConfig(
        spec.steps, spec.lr, spec.accum, seed=spec.seed, checkpoint=spec.checkpoint, selfstudy=spec.selfstudy
    )
    progress.on_log(f"training {spec.steps} steps of {config.accum} self-study conversations (lr {spec.lr})")
    try:
        result = train_cartridge(engine, cartridge, tokens, config, progress.on_step, progress.cancelled)
    except TrainingCancelled as exc:
        raise BuildCancelled(str(exc)) from exc
    progress.on_log(f"held-out loss {result.loss_first:.4f} -> {result.loss_last:.4f}")
    return result.cartridge, result.loss_first, result.loss_last
