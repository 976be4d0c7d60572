"""Speculative decoding: several tokens per forward, the same reply as plain decoding.

Each step verifies ``[carried token, draft...]`` in one forward (``Engine.verify``: every
row's logits bitwise what one-by-one decoding gives) and runs the full sampler on the rows
in order, exactly as the plain loop would on the same logits: penalties see the tokens
committed so far, the grammar masks each row after the previous token was accepted, and the
seeded RNG draws once per committed token. A row's sample is committed; while it equals the
next drafted token, the following row (computed with that token as input) is valid and is
sampled next. The first mismatch's sample is the correction; a fully accepted draft earns a
bonus token from its last row. The cache is cut back to the rows whose inputs were
committed, so after the turn it holds exactly what the plain loop leaves: the prompt and
every committed token but the last (or all of them when an end-of-generation token was
sampled). The rows go through the request's DecodeStream one at a time, so its stop strings,
budget and cancellation act at the same token as on the plain path, and the cache is cut
back there too.

Drafts and the decision to verify them (drafts.py) only change the speed, never the reply.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeAlias

import numpy as np

from inference.engine.engine import Engine
from inference.generation.drafts import (
    MAX_DRAFT,
    MUTE_WINDOW,
    CostGate,
    DraftCascade,
    DraftSource,
    RecyclingTable,
    VerifyCosts,
)
from inference.generation.stream import DecodeStream

logger = logging.getLogger("lmserve.speculative")
PROBE_TOKENS = 48  # prompt rows under the verify-cost probe
# Builds a request's draft source from its prompt tokens and the shared recycling table.
SourceFactory: TypeAlias = Callable[[Sequence[int], RecyclingTable], DraftSource]


class Speculator:
    """Speculative decoding over one engine: the recycling table every request shares and
    the verify costs measured on this machine (:meth:`measure`, at warm-up). ``sources``
    builds each request's drafts (the conversation automaton and recycling by default)."""

    def __init__(
        self, engine: Engine, costs: VerifyCosts | None = None, sources: SourceFactory = DraftCascade
    ):
        self.engine = engine
        self.costs = costs
        self.sources = sources
        self.recycling = RecyclingTable(engine.config.vocab_size)

    def measure(self) -> VerifyCosts:
        """Time verify forwards of 1..16 rows on a scratch cache (best of three each) and keep
        their costs relative to one row."""
        engine = self.engine
        tokens = engine.encode_prompt("The quick brown fox jumps over the lazy dog. " * 8)
        tokens = (tokens * (1 + PROBE_TOKENS // max(1, len(tokens))))[: PROBE_TOKENS + 16]
        cache = engine.new_cache(PROBE_TOKENS + 16)
        engine.prefill(cache, tokens[:PROBE_TOKENS])

        def forward(n: int) -> None:
            engine.verify(cache, tokens[PROBE_TOKENS : PROBE_TOKENS + n])
            cache.truncate(PROBE_TOKENS)

        forward(2)  # compile outside the timing
        self.costs = VerifyCosts.measure(forward)
        logger.info("speculation: verify cost per row count (in decode steps) %s", self.costs.describe())
        return self.costs

    def drive(self, stream: DecodeStream) -> None:
        """Run a server request's stream (prefilled, first token taken) to its end with
        speculation: the stream samples, streams and finishes every verify row exactly as
        the plain loop's ``decode_one`` rows, so its events are the plain loop's."""
        costs = self.costs if self.costs is not None else self.measure()
        cache, stats = stream.cache, stream.stats
        turn = _Turn(self, stream, CostGate(costs))
        while stream.live:
            carried = stream.token
            draft = turn.draft(stream.prompt.max_tokens - stats.generated_tokens)
            before = cache.n_tokens  # row j's input is token before + j of the cache
            try:
                rows = self.engine.verify(cache, [carried, *draft]) if draft else None
                if rows is None:
                    rows = self.engine.decode_one(cache, carried)[None]
            except Exception as exc:
                stream.fail(exc)
                return
            stats.spec_drafted += len(draft)
            accepted = judged = 0
            for i in range(rows.shape[0]):
                judged = i + 1
                stream.advance(rows[i], rows=cache.prefix_rows + before + judged, forward=i == 0)
                if not stream.live:
                    break
                turn.cascade.observe(stream.token)
                if i < len(draft) and stream.token == draft[i]:
                    accepted += 1
                    continue
                break
            stats.spec_accepted += accepted
            turn.learn(draft, accepted, rows, before + 1)
            if cache.n_tokens > before + judged:
                cache.truncate(before + judged)
        logger.info("spec: %d/%d accepted", stats.spec_accepted, stats.spec_drafted)


class _Turn:
    """One stream's drafting state: its draft sources, the cost gate, and the source of the
    draft being verified."""

    def __init__(self, speculator: Speculator, stream: DecodeStream, gate: CostGate):
        self.engine = speculator.engine
        self.recycling = speculator.recycling
        self.cache = stream.cache
        self.constraint = stream.constraint
        self.gate = gate
        self.history = stream.history  # the stream commits; the turn reads
        self._source = None  # the source of the draft being verified
        self.cascade = speculator.sources(self.history, self.recycling)

    def draft(self, remaining: int) -> list[int]:
        """The tokens to verify after the carried one; [] for a plain step. At most as many
        as the reply budget and the context leave room for (the bonus token included)."""
        cache = self.cache
        room = min(MAX_DRAFT, remaining - 1, cache.n_ctx - cache.n_positions - 1)
        if room < 1 or not self.gate.open:
            self.gate.plain_step()
            return []
        proposal, acceptance = self.cascade.propose(room)
        tokens = proposal.tokens
        for at, token in enumerate(tokens):
            if token in self.engine.stop_ids:  # the reply would end there: verify no further
                tokens = tokens[:at]
                break
        if self.constraint is not None and tokens:
            tokens = tokens[: self.constraint.valid_prefix(tokens)]
        k = self.gate.budget(len(tokens), acceptance)
        if k == 0:
            source = proposal.source
            if tokens and source is not None and len(source.outcomes) == MUTE_WINDOW:
                source.mute(self.cascade.committed)  # not worth verifying: re-probe later
            self.gate.plain_step()
            return []
        self._source = proposal.source
        return tokens[:k]

    def learn(self, draft: list[int], accepted: int, rows: np.ndarray, first: int) -> None:
        """After a verify whose first ``accepted`` drafted tokens were committed: the source's
        acceptance, the gate's realised gain, and the recycling table from the judged rows."""
        if not draft:
            return
        if self._source is not None:
            self._source.record(len(draft), accepted, self.cascade.committed)
        self.gate.record(len(draft) + 1, accepted + 1)
        inputs = self.history[first - 1 : first + accepted]  # row j's input is at first - 1 + j
        self.recycling.observe_rows(inputs, rows[: accepted + 1])
