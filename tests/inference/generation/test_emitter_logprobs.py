"""Log probabilities follow the reply text they belong to through the emitter's stages.

Each token is fed with a record naming its own bytes, so a test reads which tokens each
TextDelta reports. The rule: a token is reported with the delta holding its first reply
character; tokens whose text never reaches the reply (think block, captured call, stop string
and after) are not reported; reported tokens come in order, each once.
"""

from __future__ import annotations

import asyncio

import pytest

from inference.engine.families import HERMES_TOOLS, ThinkTags
from inference.generation.emitter import ReplyEmitter
from inference.runtime.pipe import StreamPipe
from inference.types import Finish, ReasoningDelta, TextDelta, TokenLogprob, ToolCallDelta, Usage

THINK = ThinkTags("<think>", "</think>")


def emit(emitter: ReplyEmitter, tokens: list[bytes]) -> list:
    events = []
    for i, data in enumerate(tokens):
        events += emitter.feed(data, TokenLogprob(data, -float(i)))
    return events + emitter.flush()


def reported(events: list) -> list[tuple[str, list[bytes]]]:
    """Each text delta's text and the tokens it reports."""
    return [(e.text, [r.data for r in e.logprobs]) for e in events if isinstance(e, TextDelta)]


def test_plain_text_reports_every_token_once_in_order():
    tokens = [b"The", b" sky", b" is", b" blue", b"."]
    events = emit(ReplyEmitter(), tokens)
    assert reported(events) == [(t.decode(), [t]) for t in tokens]
    assert [r.logprob for e in events for r in e.logprobs] == [0.0, -1.0, -2.0, -3.0, -4.0]


def test_a_held_stop_prefix_carries_its_tokens_when_released():
    events = emit(ReplyEmitter(stop=("STOP",)), [b"Hel", b"lo S", b"TX", b" ok"])
    # "S" waits as a possible "STOP": its token was reported with "lo " (its first character).
    assert reported(events) == [("Hel", [b"Hel"]), ("lo ", [b"lo S"]), ("STX", [b"TX"]), (" ok", [b" ok"])]


def test_tokens_swallowed_by_a_stop_string_are_not_reported():
    events = emit(ReplyEmitter(stop=("STOP",)), [b"Hel", b"lo", b" ST", b"OP", b" more"])
    assert reported(events) == [("Hel", [b"Hel"]), ("lo", [b"lo"]), (" ", [b" ST"])]
    # " ST" holds the last content character (the space): it is content's token.
    events = emit(ReplyEmitter(stop=("STOP",)), [b"Hi", b"ST", b"OP"])
    assert reported(events) == [("Hi", [b"Hi"])]


def test_a_code_point_split_over_tokens_reports_both_tokens_with_it():
    events = emit(ReplyEmitter(), [b"caf", b"\xc3", b"\xa9!", b"\xf0\x9f", b"\x98", b"\x80"])
    assert reported(events) == [
        ("caf", [b"caf"]),
        ("\u00e9!", [b"\xc3", b"\xa9!"]),
        ("\U0001f600", [b"\xf0\x9f", b"\x98", b"\x80"]),
    ]
    lossy = next(r for e in events for r in e.logprobs if r.data == b"\xc3")
    assert lossy.text == "\ufffd"  # its text is lossy, its bytes are real


def test_an_incomplete_code_point_at_the_end_is_reported_with_its_replacement():
    events = emit(ReplyEmitter(), [b"a", b"\xe2\x80"])
    assert reported(events) == [("a", [b"a"]), ("\ufffd", [b"\xe2\x80"])]


@pytest.mark.parametrize("reasoning", [True, False])
def test_think_block_tokens_are_not_reported(reasoning):
    tokens = [b"<think>", b"let me", b" see", b"</think>", b"\n\n", b"Paris", b"."]
    events = emit(ReplyEmitter(reasoning=reasoning, think=THINK), tokens)
    assert reported(events) == [("Paris", [b"Paris"]), (".", [b"."])]
    assert any(isinstance(e, ReasoningDelta) for e in events) == reasoning


def test_a_token_closing_the_think_block_and_opening_the_reply_is_reported():
    events = emit(ReplyEmitter(think=THINK), [b"<think>", b"hm", b"</think>\n\nHi", b"!"])
    assert reported(events) == [("Hi", [b"</think>\n\nHi"]), ("!", [b"!"])]


def test_call_tokens_are_not_reported_and_text_around_them_is():
    tokens = [
        b"Sure",
        b".",
        b" <tool",
        b"_call>",
        b'{"name": "f", ',
        b'"arguments": {}}',
        b"</tool_call>",
        b" Done",
    ]
    events = emit(ReplyEmitter(tools=HERMES_TOOLS), tokens)
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["TextDelta", "TextDelta", "TextDelta", "ToolCallDelta", "TextDelta"]
    # " <tool" carries the space before the call: reported with it; the call's tokens are not.
    assert reported(events) == [("Sure", [b"Sure"]), (".", [b"."]), (" ", [b" <tool"]), (" Done", [b" Done"])]
    assert isinstance(events[3], ToolCallDelta) and events[3].call.name == "f"


def test_a_region_that_is_not_a_call_is_text_with_its_tokens():
    tokens = [b"a ", b"<tool_call>", b"nope", b"</tool_call>", b" b"]
    events = emit(ReplyEmitter(tools=HERMES_TOOLS), tokens)
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "a <tool_call>nope</tool_call> b"
    assert [r.data for e in events for r in e.logprobs] == tokens


def test_a_bare_json_reply_held_whole_reports_its_tokens_at_the_end():
    tokens = [b'{"', b"x", b'": 1}']
    events = emit(ReplyEmitter(tools=HERMES_TOOLS), tokens)  # JSON, but not a call: plain text
    assert reported(events) == [('{"x": 1}', tokens)]


def test_no_record_no_logprobs():
    emitter = ReplyEmitter(stop=("x",))
    events = emitter.feed(b"Hello") + emitter.flush()
    assert events == [TextDelta("Hello")] and events[0].logprobs == ()


def test_the_pipe_merges_logprobs_with_the_text_it_merges():
    async def drain() -> list:
        pipe = StreamPipe(asyncio.get_running_loop())
        one, two = TokenLogprob(b"a", -0.5), TokenLogprob(b"b", -1.5)
        pipe.push(TextDelta("a", (one,)))
        pipe.push(TextDelta("b", (two,)))
        pipe.close(Finish("stop", Usage(1, 2)))
        return [await pipe.get(), await pipe.get()]

    merged, _ = asyncio.run(drain())
    assert merged == TextDelta("ab", (TokenLogprob(b"a", -0.5), TokenLogprob(b"b", -1.5)))
