"""Where speculative drafts come from, and whether verifying one is worth its cost.

No draft model: drafts are guesses read off text the model has already seen.

- :class:`SuffixAutomaton` indexes the conversation (prompt and reply). After each token it
  knows the longest suffix of the stream that occurred before, and where it occurred last;
  the tokens that followed that occurrence are the draft (retrieval: copying a list, editing
  code, quoting a document).
- :class:`RecyclingTable` keeps, per token, the top next tokens seen in verify logits (and
  the last bigram committed): a chain walk from the last token drafts when nothing matches.
- :class:`SourceWindow` mutes a source whose acceptance falls under 20% over its last 64
  drafted tokens, for 128 committed tokens, then lets it try again.
- :class:`VerifyCosts` is the cost of verifying n rows in decode steps, measured on this
  machine at warm-up; :class:`CostGate` drafts only as many tokens as are expected to pay for
  their rows, and stops speculating when the realised gain falls under 1.

Which drafts are verified never changes what is committed (see speculative.py): these are
speed policies only.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

MIN_MATCH = 2  # a shorter suffix match is a guess no better than recycling's
MAX_DRAFT = 15  # verify at most 16 rows (the carried token + 15)
RECYCLE_TOP = 8  # next-token candidates kept per token
RECYCLE_CHAIN = 8  # longest recycling draft
MUTE_WINDOW = 64  # drafted tokens a source's acceptance is judged over
MUTE_BELOW = 0.20  # acceptance under which a source is muted
MUTE_FOR = 128  # committed tokens a muted source sits out
MEASURED_ROWS = (1, 2, 3, 4, 6, 8, 12, 16)


class SuffixAutomaton:
    """An online suffix automaton over a token stream (Blumer et al.): O(1) amortised per
    appended token, and after each append the longest suffix of the stream that also occurs
    earlier is the suffix link of the newest state, with its length.

    Each state keeps one end position of its strings. A new state's is its own position; a
    clone inherits the original's (a valid earlier end, as the clone's strings are suffixes of
    the original's). The matched state's end is refreshed to the newest position one token
    later, when that position is in the past: drafts then follow the most recent occurrence
    (the latest revision of an edited passage is the one worth copying)."""

    def __init__(self, tokens: Sequence[int] = ()):
        self.tokens: list[int] = []
        self._next: list[dict[int, int]] = [{}]
        self._link: list[int] = [-1]
        self._length: list[int] = [0]
        self._end: list[int] = [-1]
        self._last = 0
        self._refresh: tuple[int, int] | None = None  # (state, position) applied at the next append
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        """Add one token to the stream."""
        position = len(self.tokens)
        if self._refresh is not None:
            state, end = self._refresh
            self._end[state] = end
        cur = self._new_state(self._length[self._last] + 1, {}, -1, position)
        p = self._last
        while p != -1 and token not in self._next[p]:
            self._next[p][token] = cur
            p = self._link[p]
        if p == -1:
            self._link[cur] = 0
        else:
            q = self._next[p][token]
            if self._length[p] + 1 == self._length[q]:
                self._link[cur] = q
            else:
                clone = self._new_state(self._length[p] + 1, dict(self._next[q]), self._link[q], self._end[q])
                while p != -1 and self._next[p].get(token) == q:
                    self._next[p][token] = clone
                    p = self._link[p]
                self._link[q] = self._link[cur] = clone
        self._last = cur
        self.tokens.append(int(token))
        matched = self._link[cur]
        self._refresh = (matched, position) if matched > 0 else None

    def _new_state(self, length: int, edges: dict[int, int], link: int, end: int) -> int:
        self._next.append(edges)
        self._link.append(link)
        self._length.append(length)
        self._end.append(end)
        return len(self._length) - 1

    @property
    def match_length(self) -> int:
        """Length of the longest suffix of the stream that occurred before (0 when none)."""
        return self._length[self._link[self._last]] if self._last else 0

    @property
    def match_end(self) -> int:
        """Where that earlier occurrence ends (-1 when there is none)."""
        return self._end[self._link[self._last]] if self.match_length else -1

    def draft(self, budget: int) -> list[int]:
        """Up to ``budget`` tokens that followed the matched suffix's latest earlier occurrence.
        Past the stream's end the draft repeats with the match's period (a loop keeps going)."""
        end = self.match_end
        if end < 0 or budget <= 0:
            return []
        period = len(self.tokens) - 1 - end  # > 0: the occurrence ended before the last token
        out: list[int] = []
        for j in range(budget):
            at = end + 1 + j
            out.append(self.tokens[at] if at < len(self.tokens) else out[j - period])
        return out


class RecyclingTable:
    """Per token, the most likely next tokens seen in verify logits (Token Recycling, Luo et
    al. 2024): the logits are computed anyway and would be thrown away. Shared by every
    request of a model (it knows the model, not a conversation); -1 marks an unseen entry."""

    def __init__(self, vocab_size: int, top: int = RECYCLE_TOP):
        self.next = np.full((vocab_size, top), -1, np.int32)  # (vocab, top) best first

    def observe_rows(self, inputs: Sequence[int], logits: np.ndarray) -> None:
        """Record the top next tokens after each input token; ``logits`` (len(inputs), n)."""
        top = self.next.shape[1]
        if not len(inputs) or logits.shape[1] <= top:
            return
        best = np.argpartition(logits, -top, axis=1)[:, -top:]  # (rows, top) unordered
        order = np.argsort(-np.take_along_axis(logits, best, axis=1), axis=1, kind="stable")
        ranked = np.take_along_axis(best, order, axis=1)  # (rows, top) best first
        ids = np.asarray(inputs, np.int64)
        inside = ids < self.next.shape[0]
        self.next[ids[inside]] = ranked[inside]

    def observe_bigram(self, prev: int, token: int) -> None:
        """``token`` followed ``prev``: move it to the front of ``prev``'s row."""
        if not 0 <= prev < self.next.shape[0]:
            return
        row = self.next[prev]
        found = np.flatnonzero(row == token)
        at = int(found[0]) if found.size else row.shape[0] - 1
        row[1 : at + 1] = row[:at].copy()
        row[0] = token

    def draft(self, last: int, budget: int) -> list[int]:
        """The top-1 chain from ``last``, up to ``budget`` tokens (stops at an unseen row, or
        at a padding logit past the vocabulary)."""
        out: list[int] = []
        token = last
        while len(out) < budget and 0 <= token < self.next.shape[0]:
            token = int(self.next[token, 0])
            if not 0 <= token < self.next.shape[0]:
                break
            out.append(token)
        return out


@dataclass
class SourceWindow:
    """One draft source's acceptance over its last MUTE_WINDOW drafted tokens, and its mute."""

    name: str
    outcomes: deque = field(default_factory=lambda: deque(maxlen=MUTE_WINDOW))
    muted_until: int = 0  # committed-token count at which the source may draft again
    drafted: int = 0  # totals over the request, for the stats line
    accepted: int = 0

    def muted(self, committed: int) -> bool:
        return committed < self.muted_until

    def acceptance(self, prior: float, weight: float = 2.0) -> float:
        """Estimated chance that its next drafted token is accepted: the window's rate
        blended with ``prior``, which counts as ``weight`` drafted tokens."""
        return (sum(self.outcomes) + weight * prior) / (len(self.outcomes) + weight)

    def record(self, drafted: int, accepted: int, committed: int) -> None:
        """A draft of ``drafted`` tokens had its first ``accepted`` committed."""
        self.drafted += drafted
        self.accepted += accepted
        self.outcomes.extend([True] * accepted + [False] * (drafted - accepted))
        if len(self.outcomes) == MUTE_WINDOW and sum(self.outcomes) < MUTE_BELOW * MUTE_WINDOW:
            self.mute(committed)

    def mute(self, committed: int) -> None:
        """Sit out MUTE_FOR committed tokens, then start over with a fresh window."""
        self.muted_until = committed + MUTE_FOR
        self.outcomes.clear()


@dataclass(frozen=True)
class VerifyCosts:
    """What a verify forward of n rows costs, in plain decode steps (one row = 1.0), at the
    measured row counts; interpolated between them, extrapolated past the last."""

    rows: tuple[int, ...]
    cost: tuple[float, ...]

    def of(self, n: int) -> float:
        if n <= self.rows[0]:
            return self.cost[0]
        for (r0, c0), (r1, c1) in zip(zip(self.rows, self.cost), zip(self.rows[1:], self.cost[1:])):
            if n <= r1:
                return c0 + (c1 - c0) * (n - r0) / (r1 - r0)
        slope = (self.cost[-1] - self.cost[-2]) / (self.rows[-1] - self.rows[-2])
        return self.cost[-1] + slope * (n - self.rows[-1])

    @classmethod
    def from_timings(cls, seconds: dict[int, float]) -> VerifyCosts:
        """From the best wall time of a forward of each row count (1 included): relative to
        one row, never cheaper than a smaller count (the measurement is noisy on a busy
        machine; a forward of more rows does not get cheaper)."""
        rows = tuple(sorted(seconds))
        if rows[0] != 1:
            raise ValueError("the cost of one row is the unit and must be measured")
        costs, floor = [], 1.0
        for n in rows:
            floor = max(floor, seconds[n] / seconds[1])
            costs.append(floor)
        return cls(rows, tuple(costs))

    @classmethod
    def measure(cls, forward: Callable[[int], None], reps: int = 3) -> VerifyCosts:
        """Time ``forward(n)`` (one forward of n rows, undone after) for each measured row
        count, best of ``reps``. The counts take turns within each round: a burst of other
        work on the machine then slows one round of every count, which the best of the
        rounds leaves out, rather than every timing of one count (a start-up beside a busy
        process measured verifies as dear and never speculated)."""
        best = dict.fromkeys(MEASURED_ROWS, float("inf"))
        for _ in range(reps):
            for n in MEASURED_ROWS:
                t0 = time.perf_counter()
                forward(n)
                best[n] = min(best[n], time.perf_counter() - t0)
        return cls.from_timings(best)

    def describe(self) -> str:
        return ", ".join(f"{n}: {c:.2f}" for n, c in zip(self.rows, self.cost))


class CostGate:
    """Decides how many drafted tokens to verify, from the measured verify costs.

    A verify of k drafted tokens (k + 1 rows) commits 1 + a tokens, a the accepted prefix;
    with a per-token acceptance p the expected commit is 1 + p + ... + p^k. The gate picks the
    k with the best expected tokens per decode step, and none when no k beats a plain step by
    ``min_gain``. It also keeps the realised gain of the last verifies: when that falls under
    1 (the estimates were wrong), speculation stops for ``backoff`` plain steps, doubling per
    failed re-probe up to ``backoff_max``."""

    def __init__(
        self, costs: VerifyCosts, min_gain: float = 1.05, backoff: int = 128, backoff_max: int = 1024
    ):
        self.costs = costs
        self.min_gain = min_gain
        self.base_backoff = backoff
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.paused_for = 0  # plain steps left before speculation may run again
        self._window: deque = deque(maxlen=16)  # (rows cost, tokens committed) per verify

    @property
    def open(self) -> bool:
        return self.paused_for == 0

    def budget(self, available: int, acceptance: float) -> int:
        """How many of ``available`` drafted tokens to verify (0: take a plain step)."""
        if not self.open or available <= 0:
            return 0
        best_k, best_gain, expected, term = 0, self.min_gain, 1.0, 1.0
        for k in range(1, available + 1):
            term *= acceptance
            expected += term
            gain = expected / self.costs.of(k + 1)
            if gain > best_gain:
                best_k, best_gain = k, gain
        return best_k

    def plain_step(self) -> None:
        if self.paused_for:
            self.paused_for -= 1

    def record(self, rows: int, committed: int) -> None:
        """A verify of ``rows`` rows committed ``committed`` tokens."""
        self._window.append((self.costs.of(rows), committed))
        spent = sum(cost for cost, _ in self._window)
        if len(self._window) < 2 or spent < 4:
            return
        gain = sum(c for _, c in self._window) / spent
        if gain < 1.0:
            self.paused_for = self.backoff
            self.backoff = min(2 * self.backoff, self.backoff_max)
            self._window.clear()
        elif gain >= 1.1 and len(self._window) >= 4:
            self.backoff = self.base_backoff


@dataclass(frozen=True)
class Draft:
    """Tokens proposed to follow the committed stream, and the source they came from."""

    tokens: list[int]
    source: SourceWindow | None


class DraftSource(Protocol):
    """What the speculative loop asks of a request's drafts: any deterministic proposer
    will do (a wrong draft costs time, never correctness)."""

    committed: int  # tokens committed so far in this reply

    def observe(self, token: int) -> None: ...

    def propose(self, budget: int) -> tuple[Draft, float]: ...


class DraftCascade:
    """One request's draft sources: the conversation's automaton first when its match is at
    least MIN_MATCH long, else the shared recycling table; each under its own mute."""

    def __init__(self, history: Sequence[int], recycling: RecyclingTable | None):
        self.automaton = SuffixAutomaton(history)
        self.recycling = recycling
        self.conversation = SourceWindow("conversation")
        self.recycled = SourceWindow("recycling")
        self.committed = 0

    def observe(self, token: int) -> None:
        """A token was committed."""
        if self.recycling is not None and self.automaton.tokens:
            self.recycling.observe_bigram(self.automaton.tokens[-1], token)
        self.automaton.append(token)
        self.committed += 1

    def propose(self, budget: int) -> tuple[Draft, float]:
        """The draft of the best unmuted source (up to ``budget`` tokens) with its estimated
        per-token acceptance."""
        sam = self.automaton
        if not self.conversation.muted(self.committed) and sam.match_length >= MIN_MATCH:
            length = sam.match_length
            # A long match tends to go on matching: the longer, the more it outweighs the
            # source's recent record (a poor record still mutes it).
            acceptance = self.conversation.acceptance(length / (length + 1), weight=length)
            tokens = sam.draft(min(budget, 2 * (1 + length)))
            return Draft(tokens, self.conversation), acceptance
        if self.recycling is not None and not self.recycled.muted(self.committed) and sam.tokens:
            tokens = self.recycling.draft(sam.tokens[-1], min(budget, RECYCLE_CHAIN))
            return Draft(tokens, self.recycled), self.recycled.acceptance(0.5)
        return Draft([], None), 0.0
