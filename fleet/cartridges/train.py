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

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from inference.engine.engine import Engine
from inference.engine.training import PrefixForward
from inference.engine.training.distill import distill_loss

from .file import Cartridge
from .selfstudy import Conversation, SelfStudyConfig, synthesize

HELD_OUT_SEED_OFFSET = 1_000_003  # held-out conversations come from a seed no step uses


class TrainingCancelled(Exception):
    """The caller asked training to stop."""


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation knobs. lr 2e-3 with 4 conversations a step is what the reference measured
    to train cleanly at small budgets (the paper's 2e-2 assumes ~65k supervised tokens a step)."""

    steps: int
    lr: float = 2e-3
    accum: int = 4  # conversations per optimizer step
    held_out: int = 4  # conversations in the held-out set
    seed: int = 0
    checkpoint: bool = False  # recompute per layer in the backward (bounded memory)
    beta1: float = 0.9
    beta2: float = 0.999
    adam_eps: float = 1e-8
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
        self, params: tuple[np.ndarray, np.ndarray], grads: tuple[np.ndarray, np.ndarray], c: TrainConfig
    ):
        """Update ``params`` (k, v rows) in place from ``grads``."""
        self.t += 1
        bias1 = np.float32(1.0 - c.beta1**self.t)
        bias2 = np.float32(1.0 - c.beta2**self.t)
        for p, g, m, v in zip(params, grads, (self.m_k, self.m_v), (self.v_k, self.v_v), strict=True):
            m *= np.float32(c.beta1)
            m += np.float32(1.0 - c.beta1) * g
            v *= np.float32(c.beta2)
            v += np.float32(1.0 - c.beta2) * np.square(g)
            p -= np.float32(c.lr) * (m / bias1) / (np.sqrt(v / bias2) + np.float32(c.adam_eps))

    def arrays(self) -> dict[str, np.ndarray]:
        return {"m_k": self.m_k, "v_k": self.v_k, "m_v": self.m_v, "v_v": self.v_v, "t": np.array([self.t])}

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> Adam:
        return cls(a["m_k"], a["v_k"], a["m_v"], a["v_v"], int(a["t"][0]))


class ConversationPool:
    """Self-study conversations about one corpus, synthesised on demand and kept: conversation
    i is the same whoever asks for it first (each has its own seed), so several cartridges (or
    a rerun) can train on one pool."""

    def __init__(self, engine: Engine, corpus: list[int], seed: int, config: SelfStudyConfig):
        self.engine, self.corpus, self.seed, self.config = engine, corpus, seed, config
        self._made: dict[int, Conversation] = {}

    def __getitem__(self, i: int) -> Conversation:
        if i not in self._made:
            rng = np.random.default_rng([self.seed, i])
            self._made[i] = synthesize(self.engine, self.corpus, rng, self.config)
        return self._made[i]

    def take(self, start: int, count: int) -> list[Conversation]:
        return [self[i] for i in range(start, start + count)]


def held_out_pool(engine: Engine, corpus: list[int], config: TrainConfig) -> ConversationPool:
    """The held-out conversations of a training run (a seed no training step uses)."""
    return ConversationPool(engine, corpus, config.seed + HELD_OUT_SEED_OFFSET, config.selfstudy)


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


@dataclass
class TrainResult:
    """A trained cartridge with its held-out losses and the per-step training losses."""

    cartridge: Cartridge
    loss_first: float
    loss_last: float
    history: list[float]


StepCallback = Callable[[int, int, float], None]


def train_cartridge(
    engine: Engine,
    cartridge: Cartridge,
    corpus: list[int],
    config: TrainConfig,
    on_step: StepCallback | None = None,
    cancelled: Callable[[], bool] | None = None,
    pool: ConversationPool | None = None,
    held: ConversationPool | None = None,
) -> TrainResult:
    """Train a copy of ``cartridge`` for ``config.steps`` steps; raises TrainingCancelled
    between steps when ``cancelled()`` turns true. ``pool`` and ``held`` (training and
    held-out conversations) default to pools of the config's seed; pass them to share."""
    fw = PrefixForward(engine.model)
    pool = pool or ConversationPool(engine, corpus, config.seed, config.selfstudy)
    held = held or held_out_pool(engine, corpus, config)
    held_out = held.take(0, config.held_out)
    k, v, frozen = cartridge.k.copy(), cartridge.v.copy(), cartridge.frozen_rows
    loss_first = mean_loss(fw, held_out, k, v)
    adam = Adam.zeros(k[:, :, frozen:], v[:, :, frozen:])
    history: list[float] = []
    for step in range(config.steps):
        if cancelled is not None and cancelled():
            raise TrainingCancelled(f"cancelled after {step} of {config.steps} steps")
        loss, dk, dv = accumulate(fw, pool.take(step * config.accum, config.accum), k, v, config.checkpoint)
        trainable = (k[:, :, frozen:], v[:, :, frozen:])  # views: Adam updates k, v in place
        adam.step(trainable, (dk[:, :, frozen:], dv[:, :, frozen:]), config)
        history.append(loss)
        if on_step is not None:
            on_step(step + 1, config.steps, loss)
    loss_last = mean_loss(fw, held_out, k, v)
    training = {
        **cartridge.training,
        "method": "self-study",
        "steps": config.steps,
        "lr": config.lr,
        "accum": config.accum,
        "seed": config.seed,
        "loss_first": loss_first,
        "loss_last": loss_last,
    }
    trained = Cartridge(k, v, cartridge.fingerprint, frozen, training)
    return TrainResult(trained, loss_first, loss_last, history)


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
