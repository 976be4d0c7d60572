"""Lockstep batches on real models: every stream's events are the plain loop's, and a stream's
end (a hang-up, a grammar dead end, a completed grammar, broken logits) ends that stream alone.

Each comparison runs the same requests twice on one loaded engine: one by one through
``ConversationBackend.generate`` (what ``--batch 1`` serves) and together through
``generate_batch`` (``--batch N``), each on a fresh backend so the slots start alike.
"""

from __future__ import annotations

import weakref

import pytest

from inference.engine.engine import Engine
from inference.generation.backend import ConversationBackend
from inference.generation.constraints import ConstraintSpec
from inference.generation.lockstep import Joins
from inference.generation.stream import BatchItem, DecodeStream
from inference.generation.toolcall import ToolSpec, forced_call_spec
from inference.types import (
    Error,
    Finish,
    GenerationRequest,
    Message,
    ReasoningDelta,
    SamplingOverrides,
    TextDelta,
    ToolCallDelta,
)
from tests.fixtures.model_files import default_model_path
from tests.fixtures.think_gguf import ANSWER_TEXT, THINK_TEXT, think_model_path
from tests.inference.generation.test_backend import RecordingSink

pytestmark = pytest.mark.timeout(900)

GREEDY = SamplingOverrides(temperature=0.0)
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def ask(text: str, **fields) -> GenerationRequest:
    return GenerationRequest((Message("user", text),), **{"sampling": GREEDY, **fields})


def solo(backend: ConversationBackend, requests: list[GenerationRequest]) -> list[RecordingSink]:
    sinks = []
    for request in requests:
        sink = RecordingSink()
        backend.generate(request, backend.validate(request), sink)
        sinks.append(sink)
    return sinks


def batched(
    backend: ConversationBackend, requests: list[GenerationRequest], sinks=None
) -> list[RecordingSink]:
    sinks = sinks or [RecordingSink() for _ in requests]
    items = [BatchItem(r, backend.validate(r), s) for r, s in zip(requests, sinks, strict=True)]
    generated = backend.generate_batch(items)
    for sink, count in zip(sinks, generated, strict=True):
        finish = sink.events[-1] if sink.events else None
        if isinstance(finish, Finish):
            assert finish.usage.completion_tokens == count
    return sinks


@pytest.fixture(scope="module")
def smollm2() -> Engine:
    return Engine.load(default_model_path())


def follow_up(request: GenerationRequest, sink: RecordingSink, text: str) -> GenerationRequest:
    messages = (*request.messages, Message("assistant", sink.text), Message("user", text))
    return GenerationRequest(messages, request.sampling, request.max_tokens, request.stop)


@pytest.mark.slow  # several seconds on a model: the slow tier (the fast one keeps under 5 minutes)
def test_a_batch_streams_exactly_what_the_plain_loop_streams(smollm2):
    requests = [
        ask("Name the capital city of France.", max_tokens=24),
        ask("Write a short poem about the sea, in four lines.", max_tokens=40, stop=("\n\n", "waves")),
        ask("Invent a person.", max_tokens=48, constraint=ConstraintSpec.json_schema(PERSON, "schema")),
        ask(
            "Tell me a story about a dragon.",
            sampling=SamplingOverrides(temperature=0.9, top_p=0.95, seed=1234),
            max_tokens=32,
        ),
        ask("Count from one to twenty in words.", max_tokens=12, ignore_eos=True),
    ]
    plain, lockstep = (ConversationBackend(smollm2, n_ctx=512, kv_slots=5) for _ in range(2))
    expected = solo(plain, requests)
    got = batched(lockstep, requests)
    for want, have in zip(expected, got, strict=True):
        assert have.events == want.events
    finishes = [sink.events[-1] for sink in got]
    assert {f.reason for f in finishes} == {"stop", "length"}
    assert any(f.stop_sequence for f in finishes) or "waves" not in expected[1].text

    # The next turn of each conversation continues its own slot, in the batch as alone.
    turns = [follow_up(r, s, "Go on.") for r, s in zip(requests[:4], expected[:4], strict=True)]
    expected = solo(plain, turns)
    got = batched(lockstep, turns)
    for want, have in zip(expected, got, strict=True):
        assert have.events == want.events
        assert have.events[-1].usage.cached_tokens > 0


def test_each_stream_ends_alone(smollm2):
    """A hang-up, a grammar with no first token and a grammar that completes end their own
    stream; the long stream beside them streams what it streams alone."""
    long = ask("Describe a forest in spring.", max_tokens=40, ignore_eos=True)
    requests = [
        long,
        ask("Say something.", max_tokens=40, ignore_eos=True),  # its client hangs up
        ask("Hi", constraint=ConstraintSpec("regex", "[^\\x00-\\U0010FFFF]", "regex")),  # dead end
        ask("Is water wet?", max_tokens=40, constraint=ConstraintSpec("lark", 'start: "yes" | "no"', "lark")),
    ]
    (alone,) = solo(ConversationBackend(smollm2, n_ctx=512, kv_slots=4), [long])
    backend = ConversationBackend(smollm2, n_ctx=512, kv_slots=4)
    sinks = [RecordingSink(), RecordingSink(cancel_after=2), RecordingSink(), RecordingSink()]
    kept, hung_up, dead_end, answered = batched(backend, requests, sinks)
    assert kept.events == alone.events and kept.events[-1].usage.completion_tokens == 40
    assert not any(isinstance(e, (Finish, Error)) for e in hung_up.events) and len(hung_up.events) == 2
    (error,) = dead_end.events
    assert isinstance(error, Error) and error.code == "constraint_dead_end"
    assert "after 0 generated" in error.message
    assert answered.text in ("yes", "no") and answered.events[-1].reason == "stop"
    # Every slot is free again and the batch's streams each had one of their own.
    assert not any(slot.busy for slot in backend.slots.slots)
    assert len({id(slot.cache) for slot in backend.slots.slots if slot.cache is not None}) == 4


def test_requests_that_arrive_join_between_steps_in_the_slots_of_ended_streams(smollm2):
    """Joins: a request offered while the batch runs starts at the next step boundary (the long
    stream still live) and streams what it streams alone; with as many slots as the batch is
    wide, a joiner takes the slot of a stream that has ended."""
    long = ask("Describe a forest in spring.", max_tokens=40, ignore_eos=True)
    short = ask("Say yes.", max_tokens=3, ignore_eos=True)
    late = [ask("Name a colour.", max_tokens=8, ignore_eos=True), ask("Name a fruit.", max_tokens=8)]
    expected = solo(ConversationBackend(smollm2, n_ctx=512, kv_slots=2), [long, short, *late])
    backend = ConversationBackend(smollm2, n_ctx=512, kv_slots=2)
    sinks = [RecordingSink() for _ in range(4)]
    waiting = [BatchItem(r, backend.validate(r), s) for r, s in zip(late, sinks[2:], strict=True)]
    offered: list[tuple[int, int]] = []  # (room, tokens the long stream had streamed)

    def take(room: int) -> list[BatchItem]:
        offered.append((room, len(sinks[0].events)))
        return [waiting.pop(0)] if waiting else []

    items = [BatchItem(r, backend.validate(r), s) for r, s in zip([long, short], sinks[:2], strict=True)]
    generated = backend.generate_batch(items, Joins(take, width=2))
    assert generated == [40, 3, 8, len(expected[3].events) - 1]
    for want, have in zip(expected, sinks, strict=True):
        assert have.events == want.events
    # Nothing was offered while both slots were live; each joiner came in while the long
    # stream was still streaming, into the slot the previous stream left; the last offer came
    # when every stream had ended (a request waiting then would have started the batch anew).
    assert [room for room, _ in offered[:-1]] == [1] * (len(offered) - 1) and offered[-1] == (2, 41)
    assert offered[0][1] < offered[1][1] < 40
    assert not any(slot.busy for slot in backend.slots.slots)


def test_a_batch_that_requests_keep_joining_lets_each_ended_stream_go(smollm2, monkeypatch):
    """Under steady load joins keep one batch running for as long as the load lasts (the soak
    ran one for an hour): an ended stream's numbers join the totals at once and nothing keeps
    the stream, so memory stays flat and /metrics moves while the batch runs."""
    opened: weakref.WeakSet[DecodeStream] = weakref.WeakSet()
    open_stream = ConversationBackend.open_stream

    def open_and_note(self, *args):
        stream = open_stream(self, *args)
        if stream is not None:
            opened.add(stream)
        return stream

    monkeypatch.setattr(ConversationBackend, "open_stream", open_and_note)
    backend = ConversationBackend(smollm2, n_ctx=256, kv_slots=2)
    long = ask("Describe a forest in spring.", max_tokens=60, ignore_eos=True)
    waiting = [ask(f"Say {word}.", max_tokens=3, ignore_eos=True) for word in ("yes", "no", "maybe") * 4]
    seen: list[tuple[int, int]] = []  # (streams alive, tokens in the totals) at each offer
    told: list[int] = []  # the token counts Joins.ended heard, as they came

    def take(room: int) -> list[BatchItem]:
        alive = len(opened)  # the streams nothing holds any more are gone from the WeakSet
        seen.append((alive, backend.totals.predicted_tokens))
        assert sum(told) == backend.totals.predicted_tokens  # told as each stream ended
        if not waiting:
            return []
        request = waiting.pop(0)
        return [BatchItem(request, backend.validate(request), RecordingSink())]

    generated = backend.generate_batch(
        [BatchItem(long, backend.validate(long), RecordingSink())], Joins(take, 2, ended=told.append)
    )
    assert generated == [60] + [3] * 12
    assert told == [3] * 12 + [60]
    assert max(alive for alive, _ in seen) <= 2  # the long stream and the one live joiner
    # Each offer after the first comes when a joiner has ended: its 3 tokens are counted then.
    assert [tokens for _, tokens in seen[1:13]] == [3 * n for n in range(1, 13)]


WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
    strict=True,
)


def test_reasoning_and_tool_calls_route_per_stream(synthetic_dir):
    engine = Engine.load(think_model_path(synthetic_dir))
    requests = [
        ask("Hi", reasoning=True, max_tokens=40),
        ask("Rome?", tools=(WEATHER,), constraint=forced_call_spec([WEATHER], True), max_tokens=60),
        ask("Hi", max_tokens=40),
        ask("Hello", reasoning=True, max_tokens=40, stop=("nice",)),
    ]
    plain, lockstep = (ConversationBackend(engine, n_ctx=256, kv_slots=4) for _ in range(2))
    expected = solo(plain, requests)
    got = batched(lockstep, requests)
    for want, have in zip(expected, got, strict=True):
        assert have.events == want.events
    thinking, calling, raw, stopped = got
    assert "".join(e.text for e in thinking.events if isinstance(e, ReasoningDelta)) == THINK_TEXT
    assert thinking.text == ANSWER_TEXT
    assert [type(e) for e in calling.events][-2:] == [ToolCallDelta, Finish]
    assert calling.events[-1].reason == "tool_calls" and calling.events[-2].call.name == "get_weather"
    assert raw.text == ANSWER_TEXT and not any(isinstance(e, ReasoningDelta) for e in raw.events)
    assert stopped.text == "Paris is " and stopped.events[-1].stop_sequence == "nice"


def test_broken_logits_fail_their_stream_only(synthetic_dir):
    """The overflow model's logits turn infinite after "Paris": a stream budgeted past it fails
    with a 500, one that stops before it and a constrained one beside it finish normally."""
    engine = Engine.load(think_model_path(synthetic_dir, overflow_after="Paris"))
    requests = [
        ask("Hi", max_tokens=40),
        ask("Hi", max_tokens=3),
        ask("Hi", max_tokens=40, constraint=ConstraintSpec("regex", "[a-z]{30}", "regex")),
    ]
    plain, lockstep = (ConversationBackend(engine, n_ctx=256, kv_slots=3) for _ in range(2))
    expected = solo(plain, requests)
    broken, short, constrained = batched(lockstep, requests)
    assert broken.events[-1].code == "non_finite_logits" and broken.events == expected[0].events
    # The same text and finish; only cached_tokens may differ: alone, the failed stream's slot
    # was cleared before the next request came, while in the batch the next one copied the
    # shared prompt rows from it before it failed.
    for want, have in zip(expected[1:], (short, constrained), strict=True):
        assert have.events[:-1] == want.events[:-1]
        assert have.events[-1].reason == want.events[-1].reason
        assert have.events[-1].usage.completion_tokens == want.events[-1].usage.completion_tokens
    assert short.events[-1].reason == "length" and len(constrained.text) == 30
    assert any(isinstance(e, TextDelta) for e in broken.events)
