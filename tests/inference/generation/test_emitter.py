"""TextEmitter: UTF-8-safe deltas and the stop-string scan; ReplyEmitter: stop strings act on
the reply text, after function calls were captured."""

from inference.engine.families import HERMES_TOOLS
from inference.generation.emitter import ReplyEmitter, TextEmitter
from inference.generation.toolcall import ToolCall
from inference.types import TextDelta, ToolCallDelta


def feed_all(emitter: TextEmitter, chunks: list[bytes]) -> list[str]:
    out = [emitter.feed(c) for c in chunks]
    out.append(emitter.flush())
    return out


def test_split_code_point_is_carried_to_the_next_delta():
    smile = "🙂".encode()  # 4 bytes
    deltas = feed_all(TextEmitter(), [b"a" + smile[:1], smile[1:3], smile[3:] + b"b"])
    assert deltas == ["a", "", "🙂b", ""]


def test_incomplete_code_point_at_the_end_becomes_replacement_char():
    deltas = feed_all(TextEmitter(), [b"ok", "é".encode()[:1]])
    assert "".join(deltas) == "ok\ufffd"


def test_stop_string_is_cut_and_never_emitted():
    emitter = TextEmitter(["END"])
    deltas = [emitter.feed(b"hello E"), emitter.feed(b"N"), emitter.feed(b"D and more")]
    assert deltas == ["hello ", "", ""]
    assert emitter.stopped_by == "END"
    assert emitter.feed(b"later") == "" and emitter.flush() == ""


def test_held_prefix_is_released_when_it_turns_out_not_to_be_a_stop():
    emitter = TextEmitter(["END"])
    assert emitter.feed(b"an E") == "an "
    assert emitter.feed(b"ND") == "" and emitter.stopped
    emitter = TextEmitter(["END"])
    assert emitter.feed(b"an E") == "an "
    assert emitter.feed(b"X") == "EX"
    assert emitter.feed(b"EN") == ""
    assert emitter.flush() == "EN"


def test_earliest_of_several_stops_wins():
    emitter = TextEmitter(["world", "lo w"])
    assert emitter.feed(b"hello world") == "hel"
    assert emitter.stopped_by == "lo w"


def test_stop_inside_a_multibyte_sequence_boundary():
    emitter = TextEmitter(["ö!"])
    raw = "wö!x".encode()
    deltas = [emitter.feed(raw[i : i + 1]) for i in range(len(raw))]
    assert "".join(deltas) == "w"
    assert emitter.stopped_by == "ö!"


def test_streamed_pieces_equal_the_whole_text():
    text = "Grüße, 世界! stop here? no: STOP now"
    raw = text.encode()
    emitter = TextEmitter(["STOP"])
    pieces = [emitter.feed(raw[i : i + 3]) for i in range(0, len(raw), 3)] + [emitter.flush()]
    assert "".join(pieces) == text[: text.index("STOP")]


def reply_events(emitter: ReplyEmitter, pieces: list[str]) -> list:
    events = []
    for piece in pieces:
        events += emitter.feed(piece.encode())
        if emitter.stopped:
            return events
    return events + emitter.flush()


def test_a_stop_string_inside_a_call_does_not_end_the_reply():
    emitter = ReplyEmitter(stop=("Paris", "END"), tools=HERMES_TOOLS)
    call = ['<tool_call>\n{"name": "f", "arguments": {"city": "Par', 'is"}}\n</tool_call>']
    pieces = [*call, " then END", "x"]
    events = reply_events(emitter, pieces)
    assert events == [ToolCallDelta(ToolCall("f", '{"city": "Paris"}'), 0), TextDelta(" then ")]
    assert emitter.stopped_by == "END"


def test_a_stop_string_before_a_call_ends_the_reply_without_it():
    emitter = ReplyEmitter(stop=("STOP",), tools=HERMES_TOOLS)
    events = reply_events(emitter, ["ok STOP", '<tool_call>{"name": "f"}</tool_call>'])
    assert events == [TextDelta("ok ")] and emitter.calls == 0


def test_text_held_as_a_possible_stop_is_sent_before_a_call():
    emitter = ReplyEmitter(stop=("STOP",), tools=HERMES_TOOLS)
    events = reply_events(emitter, ["ok ST", '<tool_call>{"name": "f"}</tool_call>', "OP"])
    call = ToolCallDelta(ToolCall("f", "{}"), 0)
    assert events == [TextDelta("ok "), TextDelta("ST"), call, TextDelta("OP")]
    assert not emitter.stopped
