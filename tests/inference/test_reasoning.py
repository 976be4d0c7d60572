"""Think-block routing: the text-level splitter, the reply emitter, and the backend on a
synthetic qwen3 model built to answer with a think block."""

from __future__ import annotations

import pytest

from inference.backend import ConversationBackend
from inference.constraints import ConstraintSpec
from inference.emitter import ReplyEmitter, ThinkRouter
from inference.engine.engine import Engine
from inference.types import Finish, GenerationRequest, Message, ReasoningDelta, SamplingOverrides, TextDelta
from tests.fixtures.think_gguf import ANSWER_TEXT, THINK_REPLY, THINK_TEXT, think_model_path
from tests.inference.test_backend import RecordingSink

pytestmark = pytest.mark.timeout(600)


def route(parts: list[str]) -> tuple[str, str]:
    router = ThinkRouter()
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
    emitter = ReplyEmitter(stop=("STOP",), reasoning=True)
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
    assert backend.supports_reasoning
    sink = run(backend, reasoning=True)
    reasoning = "".join(e.text for e in sink.events if isinstance(e, ReasoningDelta))
    assert (reasoning, sink.text) == (THINK_TEXT, ANSWER_TEXT)
    assert sink.events[-1].usage.reasoning_tokens > 0


def test_reasoning_off_leaves_the_text_alone(backend):
    sink = run(backend)
    assert sink.text == THINK_REPLY and not any(isinstance(e, ReasoningDelta) for e in sink.events)


def test_constrained_reply_is_plain_text(backend):
    sink = run(backend, constraint=ConstraintSpec("regex", "(yes|no)", "regex"))
    assert sink.text in ("yes", "no")
