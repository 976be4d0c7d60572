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


def log_softmax(scores: np.ndarray, temperature: float = 0.0) -> np.ndarray:
    """float64 log probabilities (vocab,) of ``scores``; ``-inf`` scores (masked tokens) stay
    ``-inf``. ``temperature`` divides the scores first when :data:`LOGPROBS_AFTER_TEMPERATURE`."""
    values = scores.astype(np.float64)
    if LOGPROBS_AFTER_TEMPERATURE and temperature > 0.0:
        values = values / temperature
    peak = values.max()
    shifted = values - peak
    return shifted - np.log(np.exp(shifted).sum())


def top_tokens(logprobs: np.ndarray, n: int) -> tuple[RankedToken, ...]:
    """The ``n`` most likely tokens with a finite log probability, most likely first; equal
    log probabilities in ascending id order (a total order: the list never depends on how a
    partition happened to split ties)."""
    finite = np.flatnonzero(np.isfinite(logprobs))
    n = min(n, finite.shape[0])
    if n <= 0:
        return ()
    values = logprobs[finite]
    if n < finite.shape[0]:
        # Everything at least as likely as the n-th value, so ties across the cut are all seen.
        threshold = np.partition(values, values.shape[0] - n)[values.shape[0] - n]
        keep = values >= threshold
        finite, values = finite[keep], values[keep]
    order = np.lexsort((finite, -values))[:n]
    return tuple(RankedToken(int(finite[i]), float(values[i])) for i in order)


def token_distribution(
    scores: np.ndarray, token: int, top_n: int, temperature: float = 0.0
) -> TokenDistribution:
    """The log probability of ``token`` under ``scores`` (vocab,) and the ``top_n`` most
    likely tokens (0..:data:`MAX_TOP_LOGPROBS`). One log-softmax over the vocabulary: call it
    only for requests that asked for log probabilities."""
    logprobs = log_softmax(scores, temperature)
    chosen = RankedToken(int(token), float(logprobs[token]))
    return TokenDistribution(chosen, top_tokens(logprobs, top_n))
