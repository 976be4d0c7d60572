"""Self-study's replies decoded in lockstep: many conversations advance one token per step in
one ``Engine.decode_batch`` forward, each with its own cache and sampler.

The rows are path invariant (a row's logits are bitwise what ``decode_one`` or a teacher-forced
forward over the same tokens gives), so a reply and its teacher targets do not depend on which
conversations it was decoded with: batching is only faster, never different. A reply that keeps
its teacher rows records the top-k of every row that chose one of its tokens, plus the row after
its last token (one extra step when the budget, not a stop token, ended it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from inference.engine.engine import BatchRow, Engine
from inference.engine.kv_cache import KVCache
from inference.engine.sampler import Sampler
from inference.engine.training.distill import TeacherTargets, teacher_targets


@dataclass
class Reply:
    """One reply being decoded: its prompt is already in ``cache`` and ``logits`` follow it."""

    cache: KVCache
    logits: np.ndarray  # (vocab,) after the last cached token
    sampler: Sampler
    history: list[int]  # prompt tokens then the reply's (the sampler's penalties read them)
    budget: int  # most tokens the reply may have
    top_k: int = 0  # > 0: keep the teacher's top-k of each row
    top_mass: float = 1.0
    end_ids: frozenset[int] = frozenset()  # tokens that end the reply once taken
    tokens: list[int] = field(default_factory=list)
    rows: list[TeacherTargets] = field(default_factory=list)
    done: bool = False

    @property
    def targets(self) -> TeacherTargets:
        """The kept rows as one (len(tokens) + 1, k) set of targets."""
        return TeacherTargets(
            np.concatenate([r.ids for r in self.rows]), np.concatenate([r.probs for r in self.rows])
        )

    def take(self, stop_ids: frozenset[int] | set[int]) -> bool:
        """Choose the next token from ``logits``; True when the cache must run it."""
        if self.top_k:
            self.rows.append(teacher_targets(self.logits[None], self.top_k, self.top_mass))
        if len(self.tokens) == self.budget:  # the row after the last token is kept: done
            self.done = True
            return False
        token = self.sampler.sample(self.logits, self.history, None)
        if token in stop_ids:
            self.done = True
            return False
        self.tokens.append(token)
        self.history.append(token)
        if token in self.end_ids:  # kept, and nothing follows it (no teacher rows past it)
            self.done = True
            return False
        if len(self.tokens) == self.budget and not self.top_k:
            self.done = True
            return False
        return True


def decode_replies(engine: Engine, replies: Sequence[Reply]) -> None:
    """Decode every reply to its end (a stop token or its budget), all in lockstep."""
    live = [r for r in replies if not r.done and r.take(engine.stop_ids)]
    while live:
        logits = engine.decode_batch([BatchRow(r.cache, r.tokens[-1]) for r in live])  # (len(live), vocab)
        for reply, row in zip(live, logits, strict=True):
            reply.logits = row
        live = [r for r in live if r.take(engine.stop_ids)]
