"""Joint training of a fleet's cartridges with mixed visibility (Cartridges at Scale).

A cartridge trained alone learns to answer as the whole prefix; composed with others at
serving it then collapses. So each round targets one document and, with probability
``1 - p_isolated``, co-loads 1..``max_distractors`` other resident cartridges beside it
(shuffled order); the conversation is about the target's text only, and every co-loaded
cartridge takes an Adam step from the round's gradient (the distractors learn to stay out
of the way). At most ``budget`` cartridges are resident (rows and Adam moments in memory);
every ``rotate_every`` rounds the most-trained residents go to disk and the least-trained
absent documents come in. A cartridge's training state (its current rows and Adam moments)
is written on eviction and read back exactly, so training continues bit for bit.

With ``held_out`` conversations per document, a cartridge is measured alone on its own
document's held-out conversations when it is first loaded (the initialisation) and whenever
it goes to disk after training; its file holds the checkpoint with the lowest loss, as a
single cartridge's build keeps its best (more rounds never write a worse cartridge).
Without, its file is its last state.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from fleet.cartridges.file import Cartridge, load_cartridge, save_cartridge
from fleet.cartridges.selfstudy import SelfStudyConfig
from fleet.cartridges.train import (
    DEFAULT_LR,
    Adam,
    ConversationPool,
    TrainConfig,
    TrainingCancelled,
    accumulate,
    mean_loss,
)
from inference.engine.engine import Engine
from inference.engine.training import PrefixForward


@dataclass(frozen=True)
class JointConfig:
    """The schedule of a joint run (the reference's defaults, scaled to small fleets)."""

    rounds: int  # optimizer rounds in total (each steps every cartridge it co-loads)
    budget: int = 4  # resident cartridges at most
    rotate_every: int = 6
    p_isolated: float = 0.75
    max_distractors: int = 2
    lr: float = DEFAULT_LR  # a single cartridge's (not swept for joint training)
    accum: int = 2  # conversations per round
    held_out: int = 0  # held-out conversations per document (0: each file keeps its last state)
    seed: int = 0
    checkpoint: bool = False
    selfstudy: SelfStudyConfig = field(default_factory=SelfStudyConfig)

    def train_config(self) -> TrainConfig:
        return TrainConfig(self.rounds, self.lr, self.accum, seed=self.seed, selfstudy=self.selfstudy)


@dataclass(frozen=True)
class FleetDocument:
    """One document of the fleet: its tokens and where its cartridge lives (written before
    training, e.g. the initial cartridge)."""

    name: str
    tokens: list[int]
    cartridge_path: Path

    @property
    def state_path(self) -> Path:
        """The training state beside the cartridge: the rows training goes on from, the Adam
        moments, the steps taken and the checkpoint the cartridge file holds."""
        return self.cartridge_path.with_name(self.cartridge_path.name + ".adam")


@dataclass(frozen=True)
class Kept:
    """The checkpoint a document's file holds: the step it is from and its held-out loss."""

    step: int
    loss: float


@dataclass
class Resident:
    """A cartridge in memory with its optimizer state, and the checkpoint its file holds
    (None until measured, or when nothing is held out)."""

    doc: int
    cartridge: Cartridge
    adam: Adam
    steps: int
    kept: Kept | None = None


def save_resident(document: FleetDocument, r: Resident, cartridge: bool = True) -> None:
    """Write the training state (the trainable rows as they are now, the Adam moments; the
    steps and the kept checkpoint in its metadata) and, with ``cartridge``, the cartridge
    file too (atomic each)."""
    if cartridge:
        save_cartridge(document.cartridge_path, r.cartridge)
    f = r.cartridge.frozen_rows
    arrays = {**r.adam.arrays(), "k": r.cartridge.k[:, :, f:], "v": r.cartridge.v[:, :, f:]}
    metadata = {"steps": str(r.steps)}
    if r.kept is not None:
        metadata |= {"kept_step": str(r.kept.step), "kept_loss": repr(r.kept.loss)}
    tmp = document.state_path.with_name(f".{document.state_path.name}.tmp-{os.getpid()}")
    try:
        save_file({name: np.ascontiguousarray(a) for name, a in arrays.items()}, str(tmp), metadata=metadata)
        os.replace(tmp, document.state_path)
    finally:
        tmp.unlink(missing_ok=True)


def load_resident(doc: int, document: FleetDocument) -> Resident:
    """Read a cartridge and its training state (fresh Adam and 0 steps when it has none): the
    rows training goes on from are the state's, which differ from the file's when the file
    keeps an earlier checkpoint."""
    cartridge = load_cartridge(document.cartridge_path)
    f = cartridge.frozen_rows
    if not document.state_path.exists():
        return Resident(doc, cartridge, Adam.zeros(cartridge.k[:, :, f:], cartridge.v[:, :, f:]), 0)
    arrays = load_file(str(document.state_path))
    if "k" in arrays:  # a state written before the rows were kept in it: the file's rows are its
        cartridge.k[:, :, f:] = arrays["k"]
        cartridge.v[:, :, f:] = arrays["v"]
    meta = state_metadata(document)
    kept = Kept(int(meta["kept_step"]), float(meta["kept_loss"])) if "kept_step" in meta else None
    return Resident(doc, cartridge, Adam.from_arrays(arrays), int(meta.get("steps", 0)), kept)


def state_metadata(document: FleetDocument) -> dict[str, str]:
    """The metadata of a document's training state (empty without one)."""
    if not document.state_path.exists():
        return {}
    with open(document.state_path, "rb") as fh:
        header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
    return header.get("__metadata__", {})


def stored_steps(document: FleetDocument) -> int:
    """The steps recorded in a document's training state (0 without one)."""
    return int(state_metadata(document).get("steps", 0))


@dataclass
class JointResult:
    """Steps each document's cartridge took, the per-round losses, how the rounds went, and
    (with held-out conversations) the checkpoint each file keeps and its initialisation's loss."""

    steps: dict[str, int]
    history: list[float]
    co_loaded_rounds: int  # rounds with distractors beside the target
    rotations: int
    kept: dict[str, Kept] = field(default_factory=dict)
    initial_loss: dict[str, float] = field(default_factory=dict)


class JointTrainer:
    """Runs the rounds of a joint fleet training over documents whose cartridges are on disk."""

    def __init__(self, engine: Engine, documents: list[FleetDocument], config: JointConfig):
        if not documents:
            raise ValueError("a fleet needs at least one document")
        if config.budget < 1:
            raise ValueError(f"budget {config.budget} must be at least 1")
        self.engine, self.docs, self.config = engine, documents, config
        self.fw = PrefixForward(engine.model)
        self.rng = np.random.default_rng([config.seed, 18])
        self.pools = [
            ConversationPool(engine, d.tokens, config.seed * 1000 + i, config.selfstudy)
            for i, d in enumerate(documents)
        ]
        # The held-out split's seed differs from the training split's (DatasetHeader.split_seed).
        self.held = [
            ConversationPool(engine, d.tokens, config.seed * 1000 + i, config.selfstudy, "held_out")
            for i, d in enumerate(documents)
        ]
        self.initial_loss: dict[int, float] = {}
        self.used = [0] * len(documents)  # conversations consumed per document
        self.steps = {i: 0 for i in range(len(documents))}
        self.residents: list[Resident] = []
        self.rotations = self.co_loaded = 0

    def load_initial(self) -> None:
        """The least-trained documents (document order breaks ties) up to the budget."""
        order = sorted(range(len(self.docs)), key=lambda i: (stored_steps(self.docs[i]), i))
        for i in order[: self.config.budget]:
            self._load(i)

    def _load(self, i: int) -> None:
        r = load_resident(i, self.docs[i])
        if not self.config.held_out:
            r.kept = None  # nothing held out: the file follows training (a resumed state's kept is stale)
        elif r.kept is None:  # the initialisation is a candidate too
            r.kept = Kept(r.steps, self.held_out_loss(r))
            self.initial_loss[i] = r.kept.loss
        self.steps[i] = r.steps
        self.residents.append(r)

    def held_out_loss(self, r: Resident) -> float:
        """The cartridge's loss alone on its document's held-out conversations."""
        convs = self.held[r.doc].take(0, self.config.held_out)
        return mean_loss(self.fw, convs, r.cartridge.k, r.cartridge.v)

    def evict(self, r: Resident) -> None:
        """Write a resident's state to disk and let it go; its file takes the current rows
        unless held-out conversations say an earlier checkpoint was better."""
        better = True
        if self.config.held_out and r.steps != r.kept.step:
            loss = self.held_out_loss(r)
            better = loss < r.kept.loss
            if better:
                r.kept = Kept(r.steps, loss)
        elif self.config.held_out:
            better = False  # measured at this very step: the file holds it already
        save_resident(self.docs[r.doc], r, cartridge=better)
        self.residents.remove(r)

    def rotate(self) -> None:
        """Swap the most-trained residents for the least-trained absent documents (at most
        half the budget at a time, at least one)."""
        absent = sorted(
            (i for i in range(len(self.docs)) if i not in {r.doc for r in self.residents}),
            key=lambda i: (self.steps[i], i),
        )
        if not absent:
            return
        n = min(len(absent), max(1, self.config.budget // 2))
        for r in sorted(self.residents, key=lambda r: (-r.steps, r.doc))[:n]:
            self.evict(r)
        for i in absent[:n]:
            self._load(i)
        self.rotations += 1

    def visible(self) -> tuple[Resident, list[Resident]]:
        """This round's target (weighted by document length) and the co-loaded parts in order."""
        lengths = np.array([len(self.docs[r.doc].tokens) for r in self.residents], np.float64)
        target = self.residents[int(self.rng.choice(len(self.residents), p=lengths / lengths.sum()))]
        others = [r for r in self.residents if r is not target]
        if not others or self.rng.random() < self.config.p_isolated:
            return target, [target]
        k = int(self.rng.integers(1, min(self.config.max_distractors, len(others)) + 1))
        picked = [others[j] for j in self.rng.permutation(len(others))[:k]]
        parts = [target, *picked]
        self.co_loaded += 1
        return target, [parts[j] for j in self.rng.permutation(len(parts))]

    def round(self) -> float:
        """One round: conversations about the target, one Adam step for every visible part."""
        target, parts = self.visible()
        c = self.config
        pool, first = self.pools[target.doc], self.used[target.doc]
        # A whole lockstep batch at once (a conversation costs about half as much decoded
        # among 16 as among 2); conversation i is the same in any batch, so no result changes.
        if first + c.accum > len(pool):
            pool.make(first, max(c.accum, pool.batch))
        convs = pool.take(first, c.accum)
        self.used[target.doc] += c.accum
        k = np.concatenate([r.cartridge.k for r in parts], axis=2)
        v = np.concatenate([r.cartridge.v for r in parts], axis=2)
        loss, dk, dv = accumulate(self.fw, convs, k, v, c.checkpoint)
        at = 0
        for r in parts:
            rows, f = r.cartridge.rows, r.cartridge.frozen_rows
            trainable = (r.cartridge.k[:, :, f:], r.cartridge.v[:, :, f:])  # views: updated in place
            r.adam.step(
                trainable, (dk[:, :, at + f : at + rows], dv[:, :, at + f : at + rows]), c.train_config()
            )
            r.steps += 1
            self.steps[r.doc] = r.steps
            at += rows
        return loss

    def run(
        self,
        on_step: Callable[[int, int, float], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> JointResult:
        """All rounds, then every resident back to disk. TrainingCancelled between rounds
        leaves every cartridge on disk as it last was saved plus the residents' progress."""
        c = self.config
        if not self.residents:
            self.load_initial()
        history = []
        try:
            for n in range(c.rounds):
                if cancelled is not None and cancelled():
                    raise TrainingCancelled(f"cancelled after {n} of {c.rounds} rounds")
                if n and n % c.rotate_every == 0:
                    self.rotate()
                history.append(self.round())
                if on_step is not None:
                    on_step(n + 1, c.rounds, history[-1])
        except BaseException:
            # Cancelled or failed: keep every resident's progress without running the model
            # again (a held-out measurement would delay the stop, or raise what just raised).
            for r in list(self.residents):
                save_resident(self.docs[r.doc], r, cartridge=not c.held_out)
            self.residents.clear()
            raise
        for r in list(self.residents):
            self.evict(r)
        names = [d.name for d in self.docs]
        steps = {names[i]: s for i, s in self.steps.items()}
        kept = {names[i]: k for i in range(len(names)) if (k := self.kept(i)) is not None}
        initial = {names[i]: loss for i, loss in self.initial_loss.items()}
        return JointResult(steps, history, self.co_loaded, self.rotations, kept, initial)

    def kept(self, i: int) -> Kept | None:
        """The checkpoint document ``i``'s file holds, as its training state records it."""
        meta = state_metadata(self.docs[i])
        return Kept(int(meta["kept_step"]), float(meta["kept_loss"])) if "kept_step" in meta else None


def train_fleet(
    engine: Engine,
    documents: list[FleetDocument],
    config: JointConfig,
    on_step: Callable[[int, int, float], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> JointResult:
    """Jointly train the cartridges at ``documents``' paths in place (the entry point
    ``fleet.fleets.build`` calls)."""
    return JointTrainer(engine, documents, config).run(on_step, cancelled)
