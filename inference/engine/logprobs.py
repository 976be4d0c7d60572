"""Log probabilities of a sampled token and its most likely alternatives.

One function, :func:`token_distribution`, computes them from the scores the sampler chose
from (:meth:`~inference.engine.sampler.Sampler.scores`: the model's logits after penalties and
after the grammar's mask), so the plain loop, a lockstep batch row and a speculative verify
row report the same numbers: their logits are bitwise equal (the engine is path invariant),
and everything after them is this one function.

Which distribution is reported is :data:`LOGPROBS_AFTER_TEMPERATURE`: the model's, before the
sampler's temperature and its truncations (top-k, top-p, min-p). That is what OpenAI's
numbers behave like (they do not move with ``temperature``) and vLLM's default (raw
logprobs); llama.cpp's ``n_probs`` instead reports post-sampling probabilities. Greedy replies
have no temperature to apply either way, and the same request reports the same numbers at any
temperature. Tokens the grammar masks have probability 0 (logprob ``-inf``) and are never among
the alternatives, so the alternatives of a constrained reply are all tokens it allows.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

# False: report log_softmax(scores), the distribution before temperature and truncation.
# True: report log_softmax(scores / temperature) when the request samples (temperature > 0).
LOGPROBS_AFTER_TEMPERATURE = False
MAX_TOP_LOGPROBS = 20  # the most alternatives per token OpenAI's dialects allow


class RankedToken(NamedTuple):
    """A token id and its log probability (natural log, <= 0)."""

    id: int
    logprob: float


class TokenDistribution(NamedTuple):
    """The sampled token's log probability and the ``top`` most likely tokens, most likely
    first (ties by ascending id)."""

    chosen: RankedToken
    top: tuple[RankedToken, ...]


def scaled(scores: np.ndarray, temperature: float = 0.0) -> np.ndarray:
    """The scores the reported distribution is the softmax of: ``scores`` themselves, or
    divided by a sampled request's ``temperature`` when :data:`LOGPROBS_AFTER_TEMPERATURE`."""
    if LOGPROBS_AFTER_TEMPERATURE and temperature > 0.0:
        return scores.astype(np.float64) / temperature
    return scores


def log_normalizer(values: np.ndarray, exact: np.ndarray | None = None) -> float:
    """``log(sum(exp(values)))``, shifted by the maximum. The exponentials run in the scores'
    own precision (float32: vectorized, ~1e-7 relative each; float64 has no vector exp here and
    costs ~8x) and are summed in float64; those of the ``exact`` ids are recomputed in float64,
    so the tokens reported (the chosen one and its alternatives) are as exact as a float64
    log-softmax where they hold the mass, and their probabilities never sum above 1."""
    peak = values.max()
    shifted = values - peak
    total = float(np.exp(shifted).sum(dtype=np.float64))
    if exact is not None and exact.shape[0]:
        total -= float(np.exp(shifted[exact]).sum(dtype=np.float64))
        total += float(np.exp(values[exact].astype(np.float64) - float(peak)).sum())
    return float(peak) + math.log(total)


def log_softmax(scores: np.ndarray, temperature: float = 0.0) -> np.ndarray:
    """float64 log probabilities (vocab,) of ``scores``; ``-inf`` scores (masked tokens) stay
    ``-inf``. ``temperature`` as :func:`scaled` says."""
    values = scaled(scores, temperature)
    return values.astype(np.float64) - log_normalizer(values)


def top_ids(values: np.ndarray, n: int) -> np.ndarray:
    """The ids of the ``n`` largest finite ``values``, largest first; equal values in ascending
    id order (a total order: the list never depends on how a partition happened to split ties)."""
    vocab = values.shape[0]
    n = min(n, vocab)
    if n <= 0:
        return np.empty(0, dtype=np.int64)
    cut = np.partition(values, vocab - n)[vocab - n] if n < vocab else -np.inf
    # Everything at least as large as the n-th value, so ties across the cut are all seen; when
    # fewer than n are finite (a grammar allows fewer), exactly the finite ones.
    ids = np.flatnonzero(values >= cut) if np.isfinite(cut) else np.flatnonzero(np.isfinite(values))
    return ids[np.lexsort((ids, -values[ids]))[:n]]


def top_tokens(logprobs: np.ndarray, n: int) -> tuple[RankedToken, ...]:
    """The ``n`` most likely tokens of a log-probability vector (see :func:`top_ids`)."""
    return tuple(RankedToken(int(i), float(logprobs[i])) for i in top_ids(logprobs, n))


def token_distribution(
    scores: np.ndarray, token: int, top_n: int, temperature: float = 0.0
) -> TokenDistribution:
    """The log probability of ``token`` under ``scores`` (vocab,) and the ``top_n`` most
    likely tokens (0..:data:`MAX_TOP_LOGPROBS`). One pass of exponentials and one partition
    over the vocabulary (~2 ms on 152k tokens): called only for requests that asked."""
    values = scaled(scores, temperature)
    ids = top_ids(values, top_n)
    normalizer = log_normalizer(values, np.union1d(ids, [token]))
    chosen = RankedToken(int(token), float(values[token]) - normalizer)
    top = tuple(RankedToken(int(i), float(values[i]) - normalizer) for i in ids)
    return TokenDistribution(chosen, top)
