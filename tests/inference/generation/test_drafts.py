"""Draft sources and the cost gate of speculative decoding (inference/generation/drafts.py)."""

from __future__ import annotations

import numpy as np
import pytest

from inference.generation import drafts
from inference.generation.drafts import (
    MUTE_FOR,
    MUTE_WINDOW,
    CostGate,
    DraftCascade,
    RecyclingTable,
    SourceWindow,
    SuffixAutomaton,
    VerifyCosts,
)


def brute_force_match(stream: list[int]) -> int:
    """Length of the longest suffix of ``stream`` that also ends at an earlier position."""
    n = len(stream)
    best = 0
    for end in range(n - 1):  # an occurrence ending at ``end`` < n - 1
        length = 0
        while length <= end and stream[end - length] == stream[n - 1 - length]:
            length += 1
        best = max(best, length)
    return best


@pytest.mark.parametrize("alphabet", [2, 3, 5, 31])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_automaton_match_equals_brute_force_after_every_append(alphabet, seed):
    rng = np.random.default_rng(seed)
    stream = [int(t) for t in rng.integers(0, alphabet, 160)]
    sam = SuffixAutomaton()
    for i, token in enumerate(stream):
        sam.append(token)
        seen = stream[: i + 1]
        length = sam.match_length
        assert length == brute_force_match(seen), f"after {i + 1} tokens"
        if length:
            end = sam.match_end
            # The occurrence it drafts from is a real earlier one of the matched suffix.
            assert end < i and seen[end - length + 1 : end + 1] == seen[len(seen) - length :]
            assert sam.draft(4)[: i - end] == seen[end + 1 : end + 5][: i - end]


def test_automaton_drafts_from_the_latest_revision_and_loops_with_the_period():
    a, b, c, x, y, z = range(1, 7)
    sam = SuffixAutomaton([a, b, c, x, 8, a, b, c, y, 9, a, b, c])
    assert sam.match_length == 3 and sam.draft(2) == [y, 9]  # not the older [x, 9]
    loop = SuffixAutomaton([z, a, b, a, b, a, b])
    assert loop.draft(6) == [a, b, a, b, a, b]  # past the stream's end it goes on with the period
    assert SuffixAutomaton([a, b, c]).draft(4) == []  # nothing occurred before


def test_automaton_stays_linear_in_states():
    rng = np.random.default_rng(3)
    sam = SuffixAutomaton(rng.integers(0, 7, 2000).tolist())
    assert len(sam._length) <= 2 * 2000 + 1


def test_recycling_ranks_verify_logits_and_moves_committed_bigrams_to_the_front():
    table = RecyclingTable(vocab_size=50, top=4)
    logits = np.zeros((2, 50), np.float32)
    logits[0, [7, 3, 9, 11]] = [4.0, 3.0, 2.0, 1.0]  # after token 5: 7 best, then 3, 9, 11
    logits[1, [5, 2, 1, 8]] = [4.0, 3.0, 2.0, 1.0]  # after token 7: 5 best
    table.observe_rows([5, 7], logits)
    assert table.next[5].tolist() == [7, 3, 9, 11]
    assert table.draft(5, 3) == [7, 5, 7]  # the top-1 chain
    table.observe_bigram(5, 9)
    assert table.next[5].tolist() == [9, 7, 3, 11]
    table.observe_bigram(5, 42)  # unseen: enters at the front, the last candidate drops out
    assert table.next[5].tolist() == [42, 9, 7, 3]
    assert table.draft(6, 3) == []  # an unseen row drafts nothing
    table.observe_bigram(6, 50)  # a padding logit past the vocabulary is never drafted
    assert table.draft(6, 3) == []


def test_a_source_under_20_percent_over_64_drafted_tokens_is_muted_then_reprobed():
    source = SourceWindow("conversation")
    for _ in range(MUTE_WINDOW // 8 - 1):
        source.record(8, 1, committed=10)  # 12.5%, window not full yet
    assert not source.muted(10)
    source.record(8, 1, committed=10)
    assert source.muted(10) and source.muted(10 + MUTE_FOR - 1)
    assert not source.muted(10 + MUTE_FOR) and len(source.outcomes) == 0  # a fresh window
    healthy = SourceWindow("recycling")
    for _ in range(MUTE_WINDOW // 8):
        healthy.record(8, 2, committed=10)  # 25%
    assert not healthy.muted(10)
    assert (source.drafted, source.accepted) == (MUTE_WINDOW, MUTE_WINDOW // 8)


def test_verify_costs_are_relative_to_one_row_monotone_and_interpolated():
    costs = VerifyCosts.from_timings({1: 0.010, 2: 0.019, 4: 0.015, 8: 0.040})
    assert costs.cost == (1.0, 1.9, 1.9, 4.0)  # a noisy cheaper 4 is floored at 2's cost
    assert costs.of(3) == pytest.approx(1.9) and costs.of(6) == pytest.approx(2.95)
    assert costs.of(10) == pytest.approx(4.0 + 2 * (4.0 - 1.9) / 4)
    with pytest.raises(ValueError, match="one row"):
        VerifyCosts.from_timings({2: 0.1})


def test_a_burst_of_other_work_during_the_measurement_is_left_out(monkeypatch):
    """A forward of n rows costs 1 + n/16 time units; for the first 8 forwards the machine is
    busy and each takes 3x. The best of the rounds must be the quiet costs, whichever count
    the burst fell on (timed one count after another, the burst took every timing of 1, 2 and
    3 rows and made the rest look cheap against them)."""
    clock = [0.0]
    calls = [0]
    monkeypatch.setattr(drafts.time, "perf_counter", lambda: clock[0])

    def forward(n: int) -> None:
        calls[0] += 1
        clock[0] += (1 + n / 16) * (3 if calls[0] <= 8 else 1)

    costs = VerifyCosts.measure(forward)
    quiet = VerifyCosts.from_timings({n: 1 + n / 16 for n in drafts.MEASURED_ROWS})
    assert costs.cost == pytest.approx(quiet.cost)


def test_gate_never_verifies_when_rows_cost_what_decoding_them_does():
    linear = CostGate(VerifyCosts((1, 16), (1.0, 16.0)))
    assert all(linear.budget(15, p) == 0 for p in (0.2, 0.5, 0.9, 0.99))
    cheap = CostGate(VerifyCosts((1, 16), (1.0, 1.2)))
    assert cheap.budget(15, 0.95) == 15 and cheap.budget(15, 0.0) == 0
    lumpy = CostGate(VerifyCosts((1, 2, 4, 8), (1.0, 1.9, 2.0, 4.5)))
    assert lumpy.budget(15, 0.9) == 3  # four rows cost little more than two


def test_gate_pauses_after_losing_verifies_and_backs_off():
    gate = CostGate(VerifyCosts((1, 8), (1.0, 4.0)), backoff=3, backoff_max=6)
    gate.record(8, 1)
    gate.record(8, 2)  # 3 tokens for 8 decode steps
    assert not gate.open and gate.budget(7, 0.99) == 0
    for _ in range(3):
        gate.plain_step()
    assert gate.open
    gate.record(8, 1)
    gate.record(8, 1)
    assert gate.paused_for == 6  # doubled


def test_cascade_prefers_a_conversation_match_and_falls_back_to_recycling():
    recycling = RecyclingTable(vocab_size=100)
    recycling.observe_bigram(3, 4)
    cascade = DraftCascade([10, 11, 12, 13, 50, 10, 11], recycling)
    draft, acceptance = cascade.propose(8)
    assert draft.source is cascade.conversation and draft.tokens[:3] == [12, 13, 50]
    assert 0.5 < acceptance < 1
    cascade.observe(3)  # "11 3" never occurred: recycling drafts from token 3
    draft, _ = cascade.propose(8)
    assert draft.source is cascade.recycled and draft.tokens == [4]
    cascade.conversation.mute(cascade.committed)
    cascade.observe(10)
    cascade.observe(11)
    assert cascade.propose(8)[0].source is cascade.recycled  # muted: the match is not used
