"""Gemma 4 thinking: ``<|think|>`` in the system turn when a request asks for reasoning, and the
reply's ``<|channel>thought ... <channel|>`` block routed as reasoning.

The routing is checked on text (the emitter) and through the conversation backend on a
synthetic file crafted to think (tests/fixtures/synthetic_gemma4_think.py), whose channel
markers are control tokens, rendered only while the think head is open."""

from __future__ import annotations

import pytest

from inference.engine.chat_template import FALLBACKS, ChatTemplate
from inference.engine.engine import Engine
from inference.engine.families import FAMILIES, GEMMA4_THINK
from inference.generation.backend import ConversationBackend
from inference.generation.capabilities import Capabilities
from inference.generation.emitter import ReplyEmitter
from inference.types import (
    Error,
    Finish,
    GenerationRequest,
    Message,
    ReasoningDelta,
    SamplingOverrides,
    TextDelta,
)
from tests.fixtures.synthetic_gemma4_think import ANSWER, REASONING, gemma4_think_path

pytestmark = pytest.mark.timeout(900)
THOUGHT_REPLY = ["<|channel>", "thought", "\n", "Two", " steps", ".", "<channel|>", "Paris", "."]


def routed(pieces: list[str], reasoning: bool) -> tuple[str, str]:
    """(reasoning, text) of a reply fed piece by piece through the Gemma 4 emitter."""
    emitter = ReplyEmitter(reasoning=reasoning, think=GEMMA4_THINK)
    events = [e for piece in pieces for e in emitter.feed(piece.encode())] + emitter.flush()
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    return "".join(e.text for e in events if isinstance(e, ReasoningDelta)), text


def test_the_thought_channel_is_reasoning():
    assert routed(THOUGHT_REPLY, reasoning=True) == ("Two steps.", "Paris.")
    assert routed(THOUGHT_REPLY, reasoning=False) == ("", "Paris.")  # dropped, never content
    # Markers split anywhere route the same; an unclosed channel stays reasoning.
    assert routed(["<|chan", "nel>tho", "ught\nA", "<chan", "nel|>B"], reasoning=True) == ("A", "B")
    assert routed(["<|channel>", "thought", "\n", "still"], reasoning=True) == ("still", "")


def test_a_reply_without_a_channel_is_all_content():
    assert routed(["Paris", "."], reasoning=True) == ("", "Paris.")
    # The stray close a primed-empty channel may leave is a template artifact, dropped.
    assert routed(["<channel|>", "Paris"], reasoning=False) == ("", "Paris")


def test_the_family_has_a_reasoning_channel():
    assert FAMILIES["gemma4"].think == GEMMA4_THINK
    assert Capabilities.of_family(FAMILIES["gemma4"], tools_rendered=False, fused=False).reasoning


def test_the_fallback_template_turns_thinking_on_in_the_system_turn():
    template = ChatTemplate(FALLBACKS["gemma4"], is_fallback=True)
    hi = [{"role": "user", "content": "Hi"}]
    assert template.render(hi) == "<|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
    assert template.render(hi, enable_thinking=False) == template.render(hi)
    on = "<|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"
    assert template.render(hi, enable_thinking=True) == on
    system = [{"role": "system", "content": "Be brief."}, *hi]
    assert template.render(system, enable_thinking=True).startswith(
        "<|turn>system\n<|think|>\nBe brief.<turn|>\n"
    )
    # An earlier reply's thought channel is not sent back to the model.
    history = [*hi, {"role": "assistant", "content": "<|channel>thought\nhmm<channel|>Hello!"}, *hi]
    assert "<|turn>model\nHello!<turn|>\n" in template.render(history) and "hmm" not in template.render(
        history
    )


@pytest.fixture(scope="module")
def backend(synthetic_dir) -> ConversationBackend:
    return ConversationBackend(Engine.load(gemma4_think_path(synthetic_dir)), n_ctx=128, kv_slots=1)


class Sink:
    def __init__(self):
        self.events: list = []
        self.cancelled = False

    def push(self, event) -> None:
        self.events.append(event)

    def close(self, final) -> None:
        self.events.append(final)

    def text(self, kind) -> str:
        return "".join(e.text for e in self.events if isinstance(e, kind))


def generate(backend: ConversationBackend, reasoning: bool) -> Sink:
    request = GenerationRequest(
        (Message("user", "What is the capital of France?"),),
        sampling=SamplingOverrides(temperature=0.0),
        max_tokens=20,
        reasoning=reasoning,
    )
    prepared = backend.validate(request)
    assert not isinstance(prepared, Error), prepared
    sink = Sink()
    backend.generate(request, prepared, sink)
    return sink


@pytest.mark.slow  # several seconds on a model: the slow tier (the fast one keeps under 5 minutes)
def test_a_thinking_reply_is_routed_through_the_backend(backend):
    on = generate(backend, reasoning=True)
    assert (on.text(ReasoningDelta), on.text(TextDelta)) == (REASONING, ANSWER)
    assert isinstance(on.events[-1], Finish) and on.events[-1].reason == "stop"  # <turn|> ended it
    off = generate(backend, reasoning=False)  # the primed-empty channel: the model answers
    assert (off.text(ReasoningDelta), off.text(TextDelta)) == ("", ANSWER)
