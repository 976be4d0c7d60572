"""Building a cartridge from a corpus: the one function the command and the Celery task run.

``build_cartridge`` tokenizes the corpus, initialises the cartridge from the model's own K/V of
its first p tokens (BOS included when the model adds one) and, with ``steps > 0``, trains it by
self-study context distillation (``fleet.cartridges.train``). Progress, the running loss and
cancellation go through a :class:`BuildProgress` the caller supplies (tqdm for the command, the
job row for Celery), so the function knows nothing about either.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Protocol

from inference.engine.engine import Engine

from .dataset import stored_settings
from .file import Cartridge, save_cartridge
from .init import initial_cartridge
from .selfstudy import SelfStudyConfig
from .train import (
    DEFAULT_LR,
    ConversationPool,
    Evaluation,
    TrainConfig,
    TrainingCancelled,
    TrainResult,
    held_out_pool,
    train_cartridge,
)


class BuildCancelled(Exception):
    """The caller asked the build to stop; nothing was written."""


class BuildProgress(Protocol):
    """Where a build reports while it runs."""

    def on_step(self, step: int, total: int, loss: float | None) -> None: ...

    def on_conversations(self, count: int, coverage: float) -> None:
        """Self-study conversations synthesised so far and how many times their supervised
        spans cover the corpus."""

    def on_held_out(self, step: int, loss: float) -> None:
        """The held-out distillation loss measured after ``step`` steps (0: the initialisation)."""

    def on_log(self, message: str) -> None: ...

    def cancelled(self) -> bool: ...


class SilentProgress:
    """Reports nowhere and never cancels."""

    def on_step(self, step: int, total: int, loss: float | None) -> None:
        pass

    def on_conversations(self, count: int, coverage: float) -> None:
        pass

    def on_held_out(self, step: int, loss: float) -> None:
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
    steps: int = 0  # optimizer steps; 0 (and no minutes) writes the untrained initialisation
    minutes: float = 0.0  # a time budget for synthesis and training together (0: none)
    dataset: Path | None = None  # a self-study dataset directory to read, resume and extend
    # (its shards' self-study settings are used when ``selfstudy`` is left at the defaults)
    lr: float = DEFAULT_LR  # Adam's step size (train.DEFAULT_LR)
    seed: int = 0
    frozen_rows: int = 1  # leading rows excluded from training (the attention sink)
    accum: int = 4  # self-study conversations per optimizer step
    checkpoint: bool = False  # recompute per layer in the backward: less memory, more time
    selfstudy: SelfStudyConfig = field(default_factory=SelfStudyConfig)  # span and reply lengths
    synthesis_share: float = 0.4  # of a time budget, the part spent synthesising conversations
    eval_every: int = 8  # steps between held-out evaluations (the best one is saved)
    held_out: int = 16  # held-out conversations the evaluations average over


@dataclass(frozen=True)
class CartridgeBuildResult:
    """The summary the command prints as its last line (JSON)."""

    path: str
    rows: int
    steps: int
    loss_first: float | None  # held-out distillation loss before training
    loss_last: float | None  # ... of the checkpoint saved (the lowest seen)
    seconds: float
    best_step: int = 0  # the step the saved checkpoint is from (0: the initialisation)
    conversations: int = 0  # distinct training conversations
    coverage: float = 0.0  # supervised span tokens of those conversations / corpus tokens

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
    spec = _with_dataset_settings(spec)
    engine = engine or Engine.load(spec.model)
    tokens = corpus_tokens(engine, spec.corpus)
    if spec.prefix_tokens < 1 or spec.prefix_tokens > len(tokens):
        raise ValueError(
            f"--prefix-tokens {spec.prefix_tokens} must be within 1..{len(tokens)} (the corpus's tokens)"
        )
    provenance = {"corpus": spec.corpus.name, "corpus_tokens": len(tokens), "seed": spec.seed, "lr": spec.lr}
    cartridge = initial_cartridge(engine, tokens[: spec.prefix_tokens], spec.frozen_rows, provenance)
    if spec.steps < 0:
        raise ValueError(f"--steps {spec.steps} must be 0 or more")
    if spec.minutes < 0:
        raise ValueError(f"--minutes {spec.minutes} must be 0 or more")
    if not 0 <= spec.synthesis_share < 1:
        raise ValueError(f"--synthesis-share {spec.synthesis_share} must be within [0, 1)")
    deadline = t0 + 60.0 * spec.minutes if spec.minutes else None
    trained = None
    if spec.steps > 0 or deadline is not None:
        trained = _train(engine, spec, cartridge, tokens, progress, t0, deadline)
        cartridge = trained.result.cartridge
    if progress.cancelled():
        raise BuildCancelled("cancelled before writing")
    save_cartridge(spec.out, cartridge)
    seconds = time.perf_counter() - t0
    if trained is None:
        return CartridgeBuildResult(str(spec.out), cartridge.rows, 0, None, None, seconds)
    result = trained.result
    return CartridgeBuildResult(
        str(spec.out),
        cartridge.rows,
        result.steps,
        result.loss_first,
        result.loss_last,
        seconds,
        result.best_step,
        trained.conversations,
        trained.coverage,
    )


def _with_dataset_settings(spec: CartridgeBuildSpec) -> CartridgeBuildSpec:
    """``spec`` with the self-study settings of its dataset's shards, so a dataset synthesised
    with other lengths (``synthesize_selfstudy --max-answer``) trains as it is; ValueError when
    the spec asks for settings of its own that differ from them."""
    stored = stored_settings(spec.dataset) if spec.dataset is not None else None
    if stored is None or stored == spec.selfstudy:
        return spec
    if spec.selfstudy != SelfStudyConfig():
        ours, theirs = asdict(spec.selfstudy), asdict(stored)
        name = next(k for k in ours if ours[k] != theirs[k])
        raise ValueError(
            f"{spec.dataset}: its conversations have {name} {theirs[name]!r}, "
            f"this build asks for {ours[name]!r}"
        )
    return replace(spec, selfstudy=stored)


@dataclass(frozen=True)
class _Trained:
    result: TrainResult
    conversations: int
    coverage: float


def _train(
    engine: Engine,
    spec: CartridgeBuildSpec,
    cartridge: Cartridge,
    tokens: list[int],
    progress: BuildProgress,
    t0: float,
    deadline: float | None,
) -> _Trained:
    """Self-study training of the initial cartridge. With a deadline: the held-out set first,
    then training conversations until the synthesis share of the budget is spent, then epochs
    over them until the deadline."""
    config = TrainConfig(
        spec.steps,
        spec.lr,
        spec.accum,
        seed=spec.seed,
        held_out=spec.held_out,
        eval_every=spec.eval_every,
        checkpoint=spec.checkpoint,
        selfstudy=spec.selfstudy,
    )
    pool = ConversationPool(engine, tokens, spec.seed, spec.selfstudy, directory=spec.dataset)
    held = held_out_pool(engine, tokens, config, spec.dataset)
    if spec.dataset is not None:
        # A rerun of an interrupted build starts from here: what its shards hold is not made again.
        progress.on_log(
            f"dataset {spec.dataset.name}: {len(pool)} training and {len(held)} held-out "
            "conversations on disk"
        )
    made = [len(pool)]

    def on_batch(n: int) -> None:
        # Each batch is on disk (with a dataset) before this runs: a cancel loses no whole batch.
        made[0] += n
        progress.on_conversations(made[0], pool.coverage(made[0]))
        if progress.cancelled():
            raise BuildCancelled(f"cancelled after {made[0]} conversations")

    if deadline is not None:
        held.make(0, config.held_out)
        budget = deadline - t0
        count = pool.make_until(t0 + spec.synthesis_share * budget, on_batch)
        if spec.steps == 0 or count < spec.steps * config.accum:
            config = replace(config, conversations=count)
    count = config.conversations or spec.steps * config.accum
    pool.make(0, count, on_batch)
    coverage = pool.coverage(count)
    progress.on_conversations(count, coverage)
    progress.on_log(
        f"training on {count} conversations (coverage {coverage:.1f}x), {config.accum} a step, lr {spec.lr}"
    )
    step_times: list[float] = []

    def on_step(step: int, total: int, loss: float) -> None:
        step_times.append(time.perf_counter())
        if deadline is not None and total == 0:  # an estimate, for the bar's ETA
            pace = (step_times[-1] - step_times[0]) / max(1, step - 1) if step > 1 else 0.0
            total = step + int((deadline - step_times[-1]) / pace) if pace else step
        progress.on_step(step, max(total, step), loss)

    def on_eval(evaluation: Evaluation) -> None:
        progress.on_held_out(evaluation.step, evaluation.loss)
        progress.on_log(f"step {evaluation.step}: held-out loss {evaluation.loss:.4f}")

    try:
        result = train_cartridge(
            engine,
            cartridge,
            tokens,
            config,
            on_step,
            progress.cancelled,
            pool,
            held,
            deadline,
            on_eval,
            state_dir=spec.dataset,  # where an interrupted build's training resumes from
        )
    except TrainingCancelled as exc:
        raise BuildCancelled(str(exc)) from exc
    if result.resumed_step:
        progress.on_log(f"training resumed at step {result.resumed_step} from the dataset's saved state")
    kept = f"step {result.best_step} of {result.steps} kept"
    if result.rewinds:
        kept += f"; spikes rewound at steps {', '.join(map(str, result.rewinds))}"
    progress.on_log(f"held-out loss {result.loss_first:.4f} -> {result.loss_last:.4f} ({kept})")
    return _Trained(result, count, coverage)
