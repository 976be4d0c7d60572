"""Training a cartridge by self-study context distillation (the Cartridges paper's method).

The student is the frozen model behind the cartridge (inference/engine/training's float32
forward); the teacher's targets come from self-study conversations (``selfstudy.py``). Loss:
per conversation, the mean over its supervised answer rows of -sum p_teacher log q_student;
a step averages ``accum`` conversations and takes one Adam step on the trainable rows (the
leading ``frozen_rows`` — the attention sink — never move). The held-out loss is the same
loss on a fixed set of conversations synthesised from another seed, so the losses before and
after training compare.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from inference.engine.engine import Engine
from inference.engine.training import PrefixForward
from inference.engine.training.distill import distill_loss

from .dataset import BatchCallback, DatasetHeader, load_split, write_shard
from .file import Cartridge
from .selfstudy import Conversation, SelfStudyConfig, plan_conversation, synthesize_batch

log = logging.getLogger("lmserve.fleet")

# Adam's step size on the cartridge rows. On self-study conversations whose answers carry the
# corpus (SmolLM2, the festival guide, p=128, 64 steps of 4) the held-out loss fell from 1.459 to
# 1.295 at 1e-2, 1.224 at 3e-2 and 1.216 at 5e-2; the best checkpoint is kept, so a rate that
# overshoots late costs nothing but the steps after its best.
DEFAULT_LR = 3e-2

# A held-out loss this far above the best one so far (relative) is a spike, not noise: a
# Qwen2.5-Coder-0.5B build at 3e-2 jumped from 1.69 to 3.25 between two evaluations and took 24
# steps to come back. Between evaluations of the builds measured the loss moved by under 10%.
DEFAULT_SPIKE = 0.25


class TrainingCancelled(Exception):
    """The caller asked training to stop."""


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation knobs. lr ``DEFAULT_LR`` with 4 conversations a step and 16 held-out
    conversations (docs/CARTRIDGES.md has the sweep behind them)."""

    steps: int  # optimizer steps; 0 with a deadline: as many as fit before it
    lr: float = DEFAULT_LR
    accum: int = 4  # conversations per optimizer step
    held_out: int = 16  # conversations in the held-out set: fewer made the kept checkpoint a coin toss
    seed: int = 0
    conversations: int = 0  # distinct training conversations, cycled as epochs; 0: a new one each time
    eval_every: int = 0  # steps between held-out evaluations (0: only at the end)
    checkpoint: bool = False  # recompute per layer in the backward (bounded memory)
    beta1: float = 0.9
    beta2: float = 0.999
    adam_eps: float = 1e-8
    # rewind to the best checkpoint with the step size halved and fresh moments when a held-out
    # loss exceeds the best by this fraction (0: never)
    spike: float = DEFAULT_SPIKE
    selfstudy: SelfStudyConfig = field(default_factory=SelfStudyConfig)


@dataclass
class Adam:
    """Adam over a cartridge's trainable rows; its state saves and reloads exactly (fleet
    eviction), so a reloaded run continues bit for bit."""

    m_k: np.ndarray
    v_k: np.ndarray
    m_v: np.ndarray
    v_v: np.ndarray
    t: int = 0

    @classmethod
    def zeros(cls, k: np.ndarray, v: np.ndarray) -> Adam:
        return cls(np.zeros_like(k), np.zeros_like(k), np.zeros_like(v), np.zeros_like(v))

    def step(
        self,
        params: tuple[np.ndarray, np.ndarray],
        grads: tuple[np.ndarray, np.ndarray],
        c: TrainConfig,
        lr_scale: float = 1.0,
    ):
        """Update ``params`` (k, v rows) in place from ``grads`` with step size
        ``c.lr * lr_scale``."""
        self.t += 1
        bias1 = np.float32(1.0 - c.beta1**self.t)
        bias2 = np.float32(1.0 - c.beta2**self.t)
        for p, g, m, v in zip(params, grads, (self.m_k, self.m_v), (self.v_k, self.v_v), strict=True):
            m *= np.float32(c.beta1)
            m += np.float32(1.0 - c.beta1) * g
            v *= np.float32(c.beta2)
            v += np.float32(1.0 - c.beta2) * np.square(g)
            p -= np.float32(c.lr * lr_scale) * (m / bias1) / (np.sqrt(v / bias2) + np.float32(c.adam_eps))

    def arrays(self) -> dict[str, np.ndarray]:
        return {"m_k": self.m_k, "v_k": self.v_k, "m_v": self.m_v, "v_v": self.v_v, "t": np.array([self.t])}

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> Adam:
        return cls(a["m_k"], a["v_k"], a["m_v"], a["v_v"], int(a["t"][0]))


class ConversationPool:
    """Self-study conversations of one split about one corpus, synthesised on demand (each
    request's missing ones in lockstep batches) and kept: conversation i is the same whoever
    asks for it first (its plan depends only on the seed and i), so several cartridges (or a
    rerun) can train on one pool. With a ``directory`` the pool is a dataset on disk
    (``dataset.py``): what is there is read, not made again, and what is made is written."""

    def __init__(
        self,
        engine: Engine,
        corpus: list[int],
        seed: int,
        config: SelfStudyConfig,
        split: str = "train",
        directory: Path | None = None,
        batch: int = 16,
    ):
        self.engine, self.corpus, self.config, self.split, self.batch = engine, corpus, config, split, batch
        self.header = DatasetHeader.describe(engine, corpus, seed, config)
        self.directory = directory
        self._made = load_split(directory, self.header, split) if directory is not None else {}

    def __len__(self) -> int:
        return len(self._made)

    def __getitem__(self, i: int) -> Conversation:
        return self.take(i, 1)[0]

    def take(self, start: int, count: int) -> list[Conversation]:
        """Conversations ``start .. start + count - 1``."""
        self.make(start, count)
        return [self._made[i] for i in range(start, start + count)]

    def make(self, start: int, count: int, on_batch: BatchCallback | None = None) -> None:
        """Synthesise whichever of conversations ``start .. start + count - 1`` are missing."""
        missing = [i for i in range(start, start + count) if i not in self._made]
        if not missing:
            return
        first, end = missing[0], missing[-1] + 1
        if self.directory is not None:
            write_shard(
                self.engine,
                self.corpus,
                self.directory,
                self.header,
                self.split,
                first,
                end - first,
                self.batch,
                on_batch,
            )
            self._made.update(load_split(self.directory, self.header, self.split))
            return
        seed = self.header.split_seed(self.split)
        for at in range(0, len(missing), self.batch):
            indices = missing[at : at + self.batch]
            plans = [plan_conversation(seed, i, len(self.corpus), self.config) for i in indices]
            made = synthesize_batch(self.engine, self.corpus, plans, self.config)
            self._made.update(zip(indices, made, strict=True))
            if on_batch is not None:
                on_batch(len(indices))

    def coverage(self, count: int) -> float:
        """How many times the supervised spans of conversations ``0 .. count - 1`` cover the
        corpus (from their plans: nothing is synthesised)."""
        seed = self.header.split_seed(self.split)
        plans = (plan_conversation(seed, i, len(self.corpus), self.config) for i in range(count))
        return sum(plan.span[1] - plan.span[0] for plan in plans) / len(self.corpus)

    def make_until(self, deadline: float, on_batch: BatchCallback | None = None) -> int:
        """Synthesise the next conversations a batch at a time until ``deadline``
        (``time.perf_counter()``) has passed (one batch at least into an empty pool); the number
        the pool then holds."""
        if not self._made:
            self.make(0, self.batch, on_batch)
        while time.perf_counter() < deadline:
            self.make(len(self._made), self.batch, on_batch)
        return len(self._made)


def held_out_pool(
    engine: Engine, corpus: list[int], config: TrainConfig, directory: Path | None = None
) -> ConversationPool:
    """The held-out conversations of a training run (a seed no training step uses)."""
    return ConversationPool(engine, corpus, config.seed, config.selfstudy, "held_out", directory)


def conversation_grad(
    fw: PrefixForward, conv: Conversation, k: np.ndarray, v: np.ndarray, checkpoint: bool = False
) -> tuple[float, np.ndarray, np.ndarray]:
    """The distillation loss of one conversation behind the prefix k, v and its gradients."""
    logits, tape = fw.forward(conv.tokens, k, v, conv.head_rows, checkpoint)
    loss, dlogits = distill_loss(logits, conv.targets)
    dk, dv = fw.backward(tape, dlogits)
    return loss, dk, dv


def conversation_loss(fw: PrefixForward, conv: Conversation, k: np.ndarray, v: np.ndarray) -> float:
    logits, _ = fw.forward(conv.tokens, k, v, conv.head_rows, checkpoint=True)
    return distill_loss(logits, conv.targets)[0]


def mean_loss(fw: PrefixForward, convs: list[Conversation], k: np.ndarray, v: np.ndarray) -> float:
    return float(np.mean([conversation_loss(fw, c, k, v) for c in convs]))


STATE_FORMAT = "lmserve-train-state/1"


def run_key(cartridge: Cartridge, config: TrainConfig, pool: ConversationPool, held: ConversationPool) -> str:
    """What a saved training state must match to be resumed: the starting cartridge, every
    knob that changes a number (recomputation in the backward does not), and both pools'
    dataset headers (model, corpus, seeds, self-study settings)."""
    knobs = asdict(config)
    knobs.pop("checkpoint")
    described = {
        "format": STATE_FORMAT,
        "config": knobs,
        "train": asdict(pool.header),
        "held_out": asdict(held.header),
        "fingerprint": cartridge.fingerprint.hex(),
        "frozen_rows": cartridge.frozen_rows,
    }
    digest = hashlib.sha256(json.dumps(described, sort_keys=True).encode())
    digest.update(np.ascontiguousarray(cartridge.k).tobytes())
    digest.update(np.ascontiguousarray(cartridge.v).tobytes())
    return digest.hexdigest()


@dataclass
class _State:
    """Training as it stood after an evaluation: enough to continue bit for bit."""

    key: str
    step: int
    k: np.ndarray
    v: np.ndarray
    adam: Adam
    best: _Best
    loss_first: float
    history: list[float]
    held_history: list[tuple[int, float]]
    lr_scale: float = 1.0
    rewinds: list[int] = field(default_factory=list)

    def save(self, path: Path) -> None:
        """Write atomically (a temporary file renamed into place): a kill mid-write leaves the
        previous state."""
        meta = {
            "format": STATE_FORMAT,
            "key": self.key,
            "step": self.step,
            "best_step": self.best.step,
            "best_loss": self.best.loss,
            "loss_first": self.loss_first,
            "history": self.history,
            "held_history": [list(point) for point in self.held_history],
            "lr_scale": self.lr_scale,
            "rewinds": self.rewinds,
        }
        arrays = {f"adam_{name}": a for name, a in self.adam.arrays().items()}
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            with tmp.open("wb") as out:
                np.savez(
                    out,
                    meta=np.array(json.dumps(meta)),
                    k=self.k,
                    v=self.v,
                    best_k=self.best.k,
                    best_v=self.best.v,
                    **arrays,
                )
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: Path, key: str) -> _State | None:
        """The state saved at ``path`` for run ``key``; None when there is none, it is another
        run's, or it cannot be read (training then starts over)."""
        try:
            with np.load(path, allow_pickle=False) as f:
                meta = json.loads(str(f["meta"]))
                if meta.get("format") != STATE_FORMAT or meta.get("key") != key:
                    return None
                adam = Adam.from_arrays(
                    {name: f[f"adam_{name}"] for name in ("m_k", "v_k", "m_v", "v_v", "t")}
                )
                best = _Best(meta["best_step"], meta["best_loss"], f["best_k"], f["best_v"])
                held_history = [(int(s), float(loss)) for s, loss in meta["held_history"]]
                return cls(
                    key,
                    meta["step"],
                    f["k"],
                    f["v"],
                    adam,
                    best,
                    meta["loss_first"],
                    meta["history"],
                    held_history,
                    meta["lr_scale"],
                    meta["rewinds"],
                )
        except (OSError, ValueError, KeyError, json.JSONDecodeError):
            return None


@dataclass
class TrainResult:
    """A trained cartridge (the checkpoint with the lowest held-out loss, the initialisation
    included), its held-out losses and the per-step training losses."""

    cartridge: Cartridge
    loss_first: float  # held-out loss of the initialisation
    loss_last: float  # held-out loss of the returned checkpoint
    history: list[float]
    best_step: int = 0  # the step the returned checkpoint is from (0: the initialisation)
    steps: int = 0  # steps taken
    held_history: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out loss)
    resumed_step: int = 0  # the step a saved state let this run start from (0: from the start)
    rewinds: list[int] = field(default_factory=list)  # steps whose held-out spike sent training back


class Evaluation(NamedTuple):
    """A held-out measurement during training: the step, the loss, and the rows measured (the
    live training arrays: copy them to keep them)."""

    step: int
    loss: float
    k: np.ndarray  # (L, kvh, p, hd_k)
    v: np.ndarray  # (L, kvh, p, hd_v)


StepCallback = Callable[[int, int, float], None]
EvalCallback = Callable[[Evaluation], None]


def train_cartridge(
    engine: Engine,
    cartridge: Cartridge,
    corpus: list[int],
    config: TrainConfig,
    on_step: StepCallback | None = None,
    cancelled: Callable[[], bool] | None = None,
    pool: ConversationPool | None = None,
    held: ConversationPool | None = None,
    deadline: float | None = None,
    on_eval: EvalCallback | None = None,
    state_dir: Path | None = None,
) -> TrainResult:
    """Train a copy of ``cartridge`` for ``config.steps`` steps, or until ``deadline``
    (``time.perf_counter()``) has passed, whichever comes first; raises TrainingCancelled
    between steps when ``cancelled()`` turns true. The held-out loss is measured before the
    first step, every ``config.eval_every`` steps and after the last; the checkpoint where it
    was lowest is the result, so training longer never returns a worse cartridge. ``pool`` and
    ``held`` (training and held-out conversations) default to pools of the config's seed.

    With a ``state_dir``, training saves its state there after every evaluation and a run of
    the same training (:func:`run_key`) started again continues from the last one saved,
    giving what an uninterrupted run gives; the state file is removed when training ends."""
    if config.steps <= 0 and deadline is None:
        raise ValueError("training needs steps > 0 or a deadline")
    fw = PrefixForward(engine.model)
    if pool is None:  # not ``pool or``: an empty pool is falsy, and it may be a dataset to fill
        pool = ConversationPool(engine, corpus, config.seed, config.selfstudy)
    if held is None:
        held = held_out_pool(engine, corpus, config)
    held_out = held.take(0, config.held_out)
    frozen = cartridge.frozen_rows
    key = run_key(cartridge, config, pool, held)
    state_path = state_dir / f"train-state-{key[:16]}.npz" if state_dir is not None else None
    state = _State.load(state_path, key) if state_path is not None else None
    if state is not None:
        k, v, adam, best, step = state.k.copy(), state.v.copy(), state.adam, state.best, state.step
        loss_first, history, held_history = state.loss_first, state.history, state.held_history
        lr_scale, rewinds = state.lr_scale, state.rewinds
        if on_eval is not None:
            on_eval(Evaluation(best.step, best.loss, best.k, best.v))
    else:
        k, v = cartridge.k.copy(), cartridge.v.copy()
        loss_first = mean_loss(fw, held_out, k, v)
        if on_eval is not None:
            on_eval(Evaluation(0, loss_first, k, v))
        best = _Best(0, loss_first, k.copy(), v.copy())
        held_history = [(0, loss_first)]
        adam = Adam.zeros(k[:, :, frozen:], v[:, :, frozen:])
        history = []
        step = 0
        lr_scale, rewinds = 1.0, []
    resumed_step = step
    total = config.steps if config.steps > 0 else 0
    while (config.steps <= 0 or step < config.steps) and (deadline is None or time.perf_counter() < deadline):
        if cancelled is not None and cancelled():
            raise TrainingCancelled(f"cancelled after {step} of {config.steps or 'timed'} steps")
        convs = [pool[i] for i in _step_indices(step, config)]
        loss, dk, dv = accumulate(fw, convs, k, v, config.checkpoint)
        trainable = (k[:, :, frozen:], v[:, :, frozen:])  # views: Adam updates k, v in place
        adam.step(trainable, (dk[:, :, frozen:], dv[:, :, frozen:]), config, lr_scale)
        history.append(loss)
        step += 1
        if on_step is not None:
            on_step(step, total, loss)
        if config.eval_every and step % config.eval_every == 0:
            best = _evaluate(fw, held_out, k, v, step, best, held_history, on_eval)
            if config.spike and held_history[-1][1] > best.loss * (1.0 + config.spike):
                # The moments still point where the spike came from: start them afresh.
                k[...], v[...] = best.k, best.v
                adam = Adam.zeros(k[:, :, frozen:], v[:, :, frozen:])
                lr_scale /= 2.0
                rewinds.append(step)
                log.info(
                    "held-out loss %.4f at step %d is a spike (best %.4f at step %d): back to step %d, lr %g",
                    held_history[-1][1],
                    step,
                    best.loss,
                    best.step,
                    best.step,
                    config.lr * lr_scale,
                )
            if state_path is not None:
                state = _State(
                    key, step, k, v, adam, best, loss_first, history, held_history, lr_scale, rewinds
                )
                state.save(state_path)
    if held_history[-1][0] != step:
        best = _evaluate(fw, held_out, k, v, step, best, held_history, on_eval)
    if state_path is not None:
        state_path.unlink(missing_ok=True)
    training = {
        **cartridge.training,
        "method": "self-study",
        "steps": step,
        "best_step": best.step,
        "lr": config.lr,
        "accum": config.accum,
        "seed": config.seed,
        "conversations": config.conversations or step * config.accum,
        "loss_first": loss_first,
        "loss_last": best.loss,
        "held_out": [list(point) for point in held_history],
        "rewinds": rewinds,
    }
    trained = Cartridge(best.k, best.v, cartridge.fingerprint, frozen, training)
    return TrainResult(
        trained, loss_first, best.loss, history, best.step, step, held_history, resumed_step, rewinds
    )


def _step_indices(step: int, config: TrainConfig) -> range | list[int]:
    """The training conversations of ``step``: the next ``accum``, or with
    ``config.conversations`` set, the next ``accum`` of epochs over that many conversations,
    each epoch in its own shuffled order (a function of the seed and the epoch, so a resumed
    run takes the same steps)."""
    first = step * config.accum
    if not config.conversations:
        return range(first, first + config.accum)
    n = config.conversations
    return [int(_epoch_order(config.seed, n, i // n)[i % n]) for i in range(first, first + config.accum)]


@functools.lru_cache(maxsize=4)
def _epoch_order(seed: int, conversations: int, epoch: int) -> np.ndarray:
    return np.random.default_rng((seed, epoch)).permutation(conversations)  # (conversations,)


@dataclass
class _Best:
    step: int
    loss: float
    k: np.ndarray
    v: np.ndarray


def _evaluate(
    fw: PrefixForward,
    held_out: list[Conversation],
    k: np.ndarray,
    v: np.ndarray,
    step: int,
    best: _Best,
    held_history: list[tuple[int, float]],
    on_eval: EvalCallback | None,
) -> _Best:
    """Measure the held-out loss of ``k, v`` at ``step``; the better of it and ``best``."""
    loss = mean_loss(fw, held_out, k, v)
    held_history.append((step, loss))
    if on_eval is not None:
        on_eval(Evaluation(step, loss, k, v))
    return _Best(step, loss, k.copy(), v.copy()) if loss < best.loss else best


def accumulate(
    fw: PrefixForward, convs: list[Conversation], k: np.ndarray, v: np.ndarray, checkpoint: bool
) -> tuple[float, np.ndarray, np.ndarray]:
    """The mean loss and gradients over ``convs`` (gradient accumulation)."""
    total, dk, dv = 0.0, np.zeros_like(k), np.zeros_like(v)
    for conv in convs:
        loss, gk, gv = conversation_grad(fw, conv, k, v, checkpoint)
        total, dk, dv = total + loss, dk + gk, dv + gv
    n = np.float32(len(convs))
    return total / len(convs), dk / n, dv / n
