"""Token sampling: penalties, then top-k, top-p, min-p, temperature, then a seeded draw.

The order follows llama.cpp's default sampler chain so that the same settings mean the same
thing here as there. Temperature 0 is greedy (argmax after penalties).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token. Defaults are neutral (greedy, no penalties)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 disables
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_last_n: int = 64
    seed: int | None = None


class NonFiniteLogits(ValueError):
    """The model's logits hold NaN or +infinity (or no finite value at all): no token can be
    chosen from them; the weights or the computation are broken."""


class Sampler:
    """Picks tokens from logits; holds its own RNG so a seed reproduces a whole reply."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def sample(
        self, logits: np.ndarray, history: Sequence[int] = (), allowed: np.ndarray | None = None
    ) -> int:
        """Return the next token id given the last position's logits and the tokens so far;
        ``allowed`` (a boolean mask over the logits) restricts the choice, e.g. to a grammar."""
        return self.choose(self.scores(logits, history, allowed))

    def scores(
        self, logits: np.ndarray, history: Sequence[int] = (), allowed: np.ndarray | None = None
    ) -> np.ndarray:
        """The scores (vocab,) the next token is chosen from: the logits after the penalties
        over ``history``, tokens outside ``allowed`` at ``-inf``. What log probabilities are
        computed from (inference.engine.logprobs), so they describe the choice made."""
        p = self.params
        peak = float(np.max(logits))  # NaN if any logit is NaN
        if not np.isfinite(peak):
            raise NonFiniteLogits(f"the model's logits are not finite (their maximum is {peak})")
        logits = apply_penalties(logits, history, p)
        if allowed is not None:
            logits = np.where(allowed, logits, -np.inf)
            if not np.isfinite(np.max(logits)):
                raise NonFiniteLogits("no token the constraint allows has a finite logit")
        return logits

    def choose(self, scores: np.ndarray) -> int:
        """The token drawn from :meth:`scores`' output: argmax when greedy, else top-k, top-p,
        min-p, temperature and one seeded draw."""
        p = self.params
        if p.temperature <= 0.0:
            return int(np.argmax(scores))
        ids, values = _candidates(scores, p.top_k)  # (k,), (k,) sorted descending
        probs = _softmax(values)
        keep = _top_p_count(probs, p.top_p)
        ids, values = ids[:keep], values[:keep]
        if p.min_p > 0.0:
            mask = _softmax(values) >= p.min_p * _softmax(values)[0]
            ids, values = ids[mask], values[mask]
        # Relative to the best candidate first: a tiny temperature then scales the gaps to
        # -inf (probability 0) instead of the logits to inf (NaN after the softmax).
        with np.errstate(over="ignore"):
            probs = _softmax((values - values[0]) / p.temperature)
        return int(ids[self.rng.choice(len(ids), p=probs)])


FLOAT32_MAX = float(np.finfo(np.float32).max)


def apply_penalties(logits: np.ndarray, history: Sequence[int], p: SamplingParams) -> np.ndarray:
    """Repeat penalty (llama.cpp style: divide positive, multiply negative logits) and the
    OpenAI presence / frequency penalties, over the last ``repeat_last_n`` tokens."""
    neutral = p.repeat_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
    if neutral or not history or p.repeat_last_n == 0:
        return logits
    window = history[-p.repeat_last_n :] if p.repeat_last_n > 0 else history
    counts = Counter(window)
    ids = np.fromiter(counts.keys(), dtype=np.int64)  # (n_distinct,)
    freq = np.fromiter(counts.values(), dtype=np.float32)  # (n_distinct,)
    out = logits.astype(np.float32, copy=True)
    picked = out[ids].astype(np.float64)
    with np.errstate(over="ignore"):  # an overflow is clipped below
        picked = np.where(picked > 0, picked / p.repeat_penalty, picked * p.repeat_penalty)
    picked = picked - freq * p.frequency_penalty - p.presence_penalty
    # A vanishing penalty (any value is a valid request) must not overflow into inf, whose
    # softmax is NaN: the most favoured tokens saturate at the largest finite logit instead.
    out[ids] = np.clip(picked, -FLOAT32_MAX, FLOAT32_MAX)
    return out


def _candidates(logits: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    if 0 < top_k < logits.shape[0]:
        ids = np.argpartition(logits, -top_k)[-top_k:]  # (top_k,)
    else:
        ids = np.arange(logits.shape[0])  # (vocab,)
    order = np.argsort(-logits[ids], kind="stable")
    ids = ids[order]
    return ids, logits[ids].astype(np.float64)


def _softmax(values: np.ndarray) -> np.ndarray:
    e = np.exp(values - values.max())
    return e / e.sum()


def _top_p_count(probs: np.ndarray, top_p: float) -> int:
    if top_p >= 1.0:
        return len(probs)
    cumulative = np.cumsum(probs)
    return int(np.searchsorted(cumulative, top_p) + 1)
