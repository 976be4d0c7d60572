"""Context distillation with sparse teacher targets: the teacher's top-k next-token
probabilities (truncated at a cumulative mass, not renormalised) against the student's
log-softmax, as in the Cartridges paper's self-study objective."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TOP_K = 20
TOP_MASS = 0.99


@dataclass(frozen=True)
class TeacherTargets:
    """Per supervised row, up to k token ids and their teacher probabilities; the entries past
    the cumulative-mass cut have probability 0 (they weigh nothing in the loss)."""

    ids: np.ndarray  # (rows, k) int64
    probs: np.ndarray  # (rows, k) float32

    @property
    def rows(self) -> int:
        return int(self.ids.shape[0])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def teacher_targets(logits: np.ndarray, k: int = TOP_K, mass: float = TOP_MASS) -> TeacherTargets:
    """The top-``k`` tokens of each row of ``logits`` (rows, vocab) and their probabilities,
    keeping the smallest prefix of them whose probabilities reach ``mass`` (at least one).
    A partition, not a sort of the vocabulary: only the k chosen entries are ordered."""
    logp = log_softmax(logits)
    k = min(k, logp.shape[-1])
    chosen = np.argpartition(-logp, k - 1, axis=-1)[:, :k]  # (rows, k) unordered
    order = np.argsort(-np.take_along_axis(logp, chosen, axis=-1), axis=-1, kind="stable")
    ids = np.take_along_axis(chosen, order, axis=-1)  # (rows, k) most likely first
    probs = np.exp(np.take_along_axis(logp, ids, axis=-1))
    before = np.cumsum(probs, axis=-1) - probs  # mass of the entries ahead of each one
    probs = np.where(before < mass, probs, 0.0)
    return TeacherTargets(ids.astype(np.int64), probs.astype(np.float32))


def distill_loss(logits: np.ndarray, targets: TeacherTargets) -> tuple[float, np.ndarray]:
    """Mean over rows of -sum_j p_teacher[j] log q_student[id_j], and its gradient with respect
    to ``logits`` (rows, vocab), in the logits' dtype."""
    if logits.shape[0] != targets.rows:
        raise ValueError(f"{logits.shape[0]} logit rows for {targets.rows} target rows")
    logq = log_softmax(logits)
    p = targets.probs.astype(np.float64)
    loss = -np.sum(p * np.take_along_axis(logq, targets.ids, axis=-1)) / targets.rows
    grad = np.exp(logq) * p.sum(axis=-1, keepdims=True)  # d/dz of -sum p log softmax(z)
    np.put_along_axis(grad, targets.ids, np.take_along_axis(grad, targets.ids, axis=-1) - p, axis=-1)
    return float(loss), (grad / targets.rows).astype(logits.dtype)
