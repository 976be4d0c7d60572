"""Think-block routing: the text-level splitter, the reply emitter, and the backend on a
synthetic qwen3 model built to answer with a think block."""

from __future__ import annotations

import pytest

from inference.engine.engine import Engine
from inference.engine.families import QWEN_THINK, ThinkTags
from inference.generation.backend import ConversationBackend
from inference.generation.constraints import ConstraintSpec
from inference.generation.emitter import ReplyEmitter, ThinkRouter
from inference.types import Finish, GenerationRequest, Message, ReasoningDelta, SamplingOverrides, TextDelta
from tests.fixtures.think_gguf import ANSWER_TEXT, THINK_TEXT, think_model_path
from tests.inference.generation.test_backend import RecordingSink

pytestmark = pytest.mark.timeout(600)


def route(parts: list[str]) -> tuple[str, str]:
    router = ThinkRouter(QWEN_THINK)
    routed = [router.feed(part) for part in parts] + [router.flush()]
    return "".join(r for r, _ in routed), "".join(t for _, t in routed)


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        (["<think>plan</think>\n\nanswer"], ("plan", "answer")),
        (["<", "th", "ink", ">pl", "an</", "think", ">", "\n", "\n", "ans", "wer"], ("plan", "answer")),
        (["\n<think>a</think>b"], ("a", "b")),
        (["</think>\n\nanswer"], ("", "answer")),  # stray leading close marker dropped
        (["answer <think>x</think>"], ("", "answer <think>x</think>")),  # not leading: plain text
        (["<thinking> is a word"], ("", "<thinking> is a word")),
        (["<think>unfinished"], ("unfinished", "")),
        (["<th"], ("", "<th")),
        (["  "], ("", "  ")),
    ],
)
def test_router_splits_a_leading_think_block(parts, expected):
    assert route(parts) == expected


def test_reply_emitter_counts_reasoning_tokens_and_keeps_stop_strings():
    emitter = ReplyEmitter(stop=("STOP",), reasoning=True, think=QWEN_THINK)
    events = []
    for piece in (b"<think>", b"a", b"b", b"</think>", b"\n\n", b"hi", b" STOP", b"never"):
        events += emitter.feed(piece)
        if emitter.stopped:
            break
    events += emitter.flush()
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert (reasoning, text, emitter.stopped_by) == ("ab", "hi ", "STOP")
    assert emitter.reasoning_tokens == 4


def emit(emitter: ReplyEmitter, pieces: list[str]) -> list:
    events = []
    for piece in pieces:
        events += emitter.feed(piece.encode())
        if emitter.stopped:
            return events
    return events + emitter.flush()


def texts(events: list) -> tuple[str, str]:
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    return reasoning, "".join(e.text for e in events if isinstance(e, TextDelta))


@pytest.mark.parametrize(
    ("pieces", "reasoning", "expected"),
    [
        (["<think>", "plan", "</think>", "\n\nanswer"], True, ("plan", "answer")),
        (["<think>", "plan", "</think>", "\n\nanswer"], False, ("", "answer")),
        (["</think>", "\n\n", "answer"], False, ("", "answer")),  # the no-think template's artifact
        (["</th", "ink>answer"], True, ("", "answer")),
        (["answer <think>x</think>"], False, ("", "answer <think>x</think>")),
    ],
)
def test_the_think_head_routes_whether_or_not_reasoning_was_asked_for(pieces, reasoning, expected):
    assert texts(emit(ReplyEmitter(think=QWEN_THINK, reasoning=reasoning), pieces)) == expected


@pytest.mark.parametrize("reasoning", [True, False])
def test_stop_strings_act_on_the_reply_not_the_think_block(reasoning):
    emitter = ReplyEmitter(stop=("plan", "S"), think=QWEN_THINK, reasoning=reasoning)
    events = emit(emitter, ["<think>a plan", "</think>", "\nan", "swer S", "more"])
    assert texts(events) == ("a plan" if reasoning else "", "answer ")
    assert emitter.stopped_by == "S"


@pytest.fixture(scope="module")
def backend(synthetic_dir) -> ConversationBackend:
    return ConversationBackend(Engine.load(think_model_path(synthetic_dir)), 256)


def run(backend, **fields) -> RecordingSink:
    request = GenerationRequest((Message("user", "Hi"),), SamplingOverrides(temperature=0.0), 40, **fields)
    sink = RecordingSink()
    backend.generate(request, backend.validate(request), sink)
    assert isinstance(sink.events[-1], Finish)
    return sink


def test_think_model_routes_reasoning(backend):
    assert backend.capabilities.reasoning
    sink = run(backend, reasoning=True)
    reasoning = "".join(e.text for e in sink.events if isinstance(e, ReasoningDelta))
    assert (reasoning, sink.text) == (THINK_TEXT, ANSWER_TEXT)
    assert sink.events[-1].usage.reasoning_tokens > 0


def test_reasoning_off_drops_the_think_block(backend):
    sink = run(backend)
    assert sink.text == ANSWER_TEXT and not any(isinstance(e, ReasoningDelta) for e in sink.events)
    assert sink.events[-1].usage.reasoning_tokens > 0  # the block was generated all the same


@pytest.mark.parametrize("reasoning", [True, False])
def test_a_stop_string_inside_the_think_block_does_not_end_the_reply(backend, reasoning):
    sink = run(backend, reasoning=reasoning, stop=("see", "nice"))
    routed = "".join(e.text for e in sink.events if isinstance(e, ReasoningDelta))
    assert (routed, sink.text) == (THINK_TEXT if reasoning else "", "Paris is ")
    assert sink.events[-1].stop_sequence == "nice"


def test_constrained_reply_is_plain_text(backend):
    sink = run(backend, constraint=ConstraintSpec("regex", "(yes|no)", "regex"))
    assert sink.text in ("yes", "no")


def test_think_router_follows_the_family_tags():
    router = ThinkRouter(ThinkTags("<|content_thinking|>", "<|content_text|>"))
    out = [router.feed(piece) for piece in ("<|content_thi", "nking|>weigh it<|content_", "text|> Done.")]
    out.append(router.flush())
    assert "".join(r for r, _ in out) == "weigh it"
    assert "".join(t for _, t in out) == "Done."
