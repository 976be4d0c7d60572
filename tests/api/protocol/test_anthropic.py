"""Anthropic Messages request validation, error envelope and event encoder, without a server.

The encoder is also driven with synthetic event sequences that include reasoning (which no
served model produces yet) and accumulated by the anthropic SDK's own stream helper."""

import pytest

from api.errors import ApiError, wants_anthropic_errors
from api.protocol.anthropic import MessagesRequest
from api.protocol.anthropic.encoder import CONTENT_KEEPALIVE_AFTER, MessagesEncoder
from api.protocol.chat.request import ChatCompletionRequest
from inference.engine.sampler import SamplingParams
from inference.generation.constraints import ConstraintSpec
from inference.generation.toolcall import ToolCall
from inference.types import Error, Finish, Message, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from tests.api.conftest import accumulate_anthropic, anthropic_shape, encode

USER = [{"role": "user", "content": "hi"}]
USAGE = Usage(prompt_tokens=40, completion_tokens=9, cached_tokens=25)
THINKING = {"type": "enabled", "budget_tokens": 1024}


def parse(**fields):
    return MessagesRequest.parse({"max_tokens": 16, "messages": USER, **fields})


def test_full_request_maps_onto_the_generation_request():
    request = parse(
        model="claude-whatever",
        system=[
            {"type": "text", "text": "be brief"},
            {"type": "text", "text": "be kind", "cache_control": {}},
        ],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "c"},
                ],
            },
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "only", "signature": ""}]},
            {"role": "user", "content": "d"},
        ],
        stop_sequences=["END", "\n\n"],
        stream=True,
        temperature=0.2,
        top_p=0.9,
        top_k=7,
        thinking={"type": "enabled", "budget_tokens": 2048},
        metadata={"user_id": "u"},
        service_tier="auto",
        cache_control={"type": "ephemeral"},
        tool_choice={"type": "auto"},
        tools=[],
    )
    assert isinstance(request, MessagesRequest) and request.stream and request.thinking
    generation = request.to_generation(reasoning_available=False)
    assert generation.messages == (
        Message("system", "be brief\nbe kind"),
        Message("user", "a\nb"),
        Message("assistant", "c"),
        Message("user", "d"),
    )
    assert generation.max_tokens == 16 and generation.stop == ("END", "\n\n")
    assert not generation.reasoning  # thinking is a no-op without a reasoning channel
    assert request.to_generation(reasoning_available=True).reasoning
    params = generation.sampling.resolve(SamplingParams())
    assert (params.temperature, params.top_p, params.top_k) == (0.2, 0.9, 7)


def test_max_tokens_is_required_except_for_count_tokens():
    missing = MessagesRequest.parse({"messages": USER})
    assert isinstance(missing, ApiError) and (missing.status, missing.param) == (400, "max_tokens")
    assert missing.code == "missing_required_parameter"
    counted = MessagesRequest.parse({"messages": USER, "system": "s"}, count_only=True)
    assert counted.max_tokens is None and counted.to_generation(False).messages[0] == Message("system", "s")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}]},
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages[0].content[0].type",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        (
            {"tools": [{"name": "f", "input_schema": {}}, {"type": "code_execution_20250825"}]},
            "tools[1].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "web_search_tool_result", "content": []}]}]},
            "messages[0].content[0].type",
        ),
        ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "mcp_servers"),
        ({"container": "c_1"}, "container"),
    ],
)
def test_media_and_server_tools_are_400_naming_the_parameter(fields, param):
    error = parse(**fields)
    assert isinstance(error, ApiError) and (error.status, error.param) == (400, param)
    assert param in error.message


def test_a_final_assistant_message_is_a_prefill():
    content = [
        {"type": "thinking", "thinking": "x", "signature": ""},
        {"type": "text", "text": "The answer is"},
    ]
    request = parse(messages=[*USER, {"role": "assistant", "content": content}], thinking=THINKING)
    generation = request.to_generation(reasoning_available=True)
    assert [m.role for m in generation.messages] == ["user"] and generation.prefill == "The answer is"
    assert not generation.reasoning  # the reply starts with the prefill, not a think block
    empty = parse(messages=[*USER, {"role": "assistant", "content": ""}]).to_generation(False)
    assert [m.role for m in empty.messages] == ["user"] and empty.prefill == ""


@pytest.mark.parametrize(
    ("last", "extra", "param"),
    [
        ({"role": "assistant", "content": "The answer is "}, {}, "messages[1].content"),
        (
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            {},
            "messages[1].content",
        ),
        (
            {"role": "assistant", "content": "{"},
            {"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
            "output_config.format.schema",
        ),
    ],
)
def test_prefills_that_cannot_be_continued_are_400(last, extra, param):
    error = parse(messages=[*USER, last], **extra)
    assert isinstance(error, ApiError) and (error.status, error.param) == (400, param)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        (
            {"messages": [*USER, {"role": "system", "content": [{"type": "image"}]}]},
            "messages[1].content[0].type",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
        ({"messages": [{"role": "user", "content": [{"type": "audio"}]}]}, "messages[0].content[0].type"),
        ({"system": [{"type": "image"}]}, "system[0].type"),
        ({"temperature": 1.5}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"stop_sequences": "END"}, "stop_sequences"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"thinking": {"type": "sometimes"}}, "thinking.type"),
        ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ],
)
def test_malformed_fields_are_400(fields, param):
    error = parse(**fields)
    assert isinstance(error, ApiError) and (error.status, error.param) == (400, param)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": [{"role": [], "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": {"a": 1}, "content": "hi"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": [], "text": "hi"}]}]},
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": {}, "text": "hi"}]}]},
            "messages[0].content[0].type",
        ),
        ({"system": [{"type": ["text"], "text": "s"}]}, "system[0].type"),
        ({"tools": [{"type": ["custom"], "name": "f", "input_schema": {}}]}, "tools[0].type"),
        ({"tool_choice": {"type": ["auto"]}}, "tool_choice.type"),
        ({"thinking": {"type": {"enabled": True}}}, "thinking.type"),
        ({"output_config": {"format": {"type": ["json_schema"]}}}, "output_config.format.type"),
    ],
)
def test_a_non_string_role_or_type_is_invalid_type_not_a_crash(fields, param):
    """A content block ``type`` that is an array or object is a 400 rather than a TypeError
    from the media-block table; roles and the other tags answer the same way."""
    error = parse(**fields)
    assert isinstance(error, ApiError)
    assert (error.status, error.anthropic_type, error.code, error.param) == (
        400,
        "invalid_request_error",
        "invalid_type",
        param,
    )
    assert f"'{param}'" in error.message and "expected a string" in error.message


def test_system_messages_inside_messages_stay_in_place():
    """Claude Code sends its agent list as a system message after the first user turn."""
    request = parse(
        system="be brief",
        messages=[
            *USER,
            {
                "role": "system",
                "content": [{"type": "text", "text": "agents:"}, {"type": "text", "text": "x"}],
            },
            {"role": "system", "content": "more"},
        ],
    )
    assert [(m.role, m.content) for m in request.to_generation(False).messages] == [
        ("system", "be brief"),
        ("user", "hi"),
        ("system", "agents:\nx"),
        ("system", "more"),
    ]


def test_thinking_off_and_adaptive():
    assert not parse(thinking={"type": "disabled"}).thinking
    assert parse(thinking={"type": "adaptive"}).thinking


# -- the error envelope -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (405, "invalid_request_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (501, "api_error"),
        (503, "overloaded_error"),
    ],
)
def test_anthropic_error_type_follows_the_status(status, kind):
    payload = ApiError(status, "why", "p", "c").anthropic_payload()
    assert payload == {"type": "error", "error": {"type": kind, "message": "why"}}


def test_which_requests_get_the_anthropic_envelope():
    for path in ("/v1/messages", "/messages/", "/v1/messages/count_tokens"):
        assert wants_anthropic_errors(path, [])
    assert not wants_anthropic_errors("/v1/chat/completions", [(b"authorization", b"Bearer k")])
    assert wants_anthropic_errors("/v1/nope", [(b"Anthropic-Version", b"2023-06-01")])


# -- the encoder ------------------------------------------------------------------------------
def run(events) -> tuple[MessagesEncoder, list[dict]]:
    encoder = MessagesEncoder("the-model")
    return encoder, encode(encoder, events)


def test_thinking_block_comes_first_and_is_closed_by_a_signature():
    deltas = [ReasoningDelta("let me "), ReasoningDelta("see"), TextDelta("Hi"), TextDelta("!")]
    encoder, events = run([*deltas, Finish("stop", USAGE)])
    assert anthropic_shape(events) == [
        "message_start",
        "content_block_start",
        "thinking_delta",
        "thinking_delta",
        "signature_delta",
        "content_block_stop",
        "content_block_start",
        "text_delta",
        "text_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert set(start["usage"].values()) == {0}
    assert [e.get("index") for e in events[1:10]] == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert events[1]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert events[-2]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    usage = {
        "input_tokens": 15,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 25,
        "output_tokens": 9,
    }
    assert events[-2]["usage"] == encoder.message["usage"] == usage
    assert encoder.message["content"] == [
        {"type": "thinking", "thinking": "let me see", "signature": ""},
        {"type": "text", "text": "Hi!"},
    ]
    final = accumulate_anthropic(events)
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "let me see" and final.content[1].text == "Hi!"
    assert final.stop_reason == "end_turn" and final.usage.cache_read_input_tokens == 25


@pytest.mark.parametrize(
    ("finish", "reason", "sequence"),
    [
        (Finish("stop", USAGE, stop_sequence="END"), "stop_sequence", "END"),
        (Finish("length", USAGE), "max_tokens", None),
    ],
)
def test_stop_reasons(finish, reason, sequence):
    encoder, events = run([TextDelta("abc"), finish])
    assert encoder.message["stop_reason"] == reason and encoder.message["stop_sequence"] == sequence
    final = accumulate_anthropic(events)
    assert (final.stop_reason, final.stop_sequence, final.content[0].text) == (reason, sequence, "abc")


def test_an_empty_reply_still_has_a_text_block():
    encoder, events = run([Finish("stop", Usage(3, 1))])
    assert anthropic_shape(events) == [
        "message_start",
        "content_block_start",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert encoder.message["content"] == [{"type": "text", "text": ""}]


def test_a_failure_is_one_error_event():
    _, events = run([TextDelta("partial"), Error(503, "the server is shutting down", code="shutting_down")])
    assert anthropic_shape(events) == ["message_start", "content_block_start", "text_delta", "error"]
    assert events[-1] == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "the server is shutting down"},
    }


@pytest.mark.parametrize(
    ("finish", "expected"),
    [
        (Finish("tool_calls", USAGE, "STOP"), ("tool_use", None)),
        (Finish("length", USAGE, "STOP"), ("max_tokens", None)),
        (Finish("stop", USAGE, "STOP"), ("stop_sequence", "STOP")),
        (Finish("stop", USAGE), ("end_turn", None)),
    ],
)
def test_stop_reason_and_stop_sequence_never_disagree(finish, expected):
    encoder = MessagesEncoder("m")
    events = encode(encoder, [TextDelta("hi"), finish])
    delta = next(e["delta"] for e in events if e["type"] == "message_delta")
    assert (delta["stop_reason"], delta["stop_sequence"]) == expected
    assert (encoder.final["stop_reason"], encoder.final["stop_sequence"]) == expected
    streamed = accumulate_anthropic(events)
    assert (streamed.stop_reason, streamed.stop_sequence) == expected


def test_a_long_wait_keeps_alive_with_empty_text_deltas_the_sdk_accumulates():
    """Past CONTENT_KEEPALIVE_AFTER the pings carry an empty delta of an early text block
    (Claude Code's watchdog counts events its SDK yields, and the SDK skips pings); the reply
    text then continues that block, and a call after it follows an empty text block."""
    encoder = MessagesEncoder("m")
    events = encoder.start() + encoder.keepalive()
    assert [e["type"] for e in events] == ["message_start", "ping"]
    encoder.started -= CONTENT_KEEPALIVE_AFTER
    waited = encoder.keepalive() + encoder.keepalive()
    assert [e["type"] for e in waited] == [
        "ping",
        "content_block_start",
        "content_block_delta",
        "ping",
        "content_block_delta",
    ]
    events += waited + encoder.delta(TextDelta("Hello")) + encoder.finish(Finish("stop", USAGE))
    message = accumulate_anthropic(events)
    assert [(block.type, block.text) for block in message.content] == [("text", "Hello")]
    assert anthropic_shape(events).count("content_block_start") == 1

    calls = MessagesEncoder("m")
    calls.started -= CONTENT_KEEPALIVE_AFTER
    call = ToolCallDelta(ToolCall("Read", '{"file_path": "a"}'), 0)
    events = calls.start() + calls.keepalive() + calls.delta(call) + calls.finish(Finish("tool_calls", USAGE))
    message = accumulate_anthropic(events)
    assert [block.type for block in message.content] == ["text", "tool_use"] and message.content[0].text == ""


# -- stop_sequences' bound, the regex and lark extensions -----------------------------------------
def test_stop_sequences_are_bounded_with_a_400_naming_the_limit():
    assert parse(stop_sequences=[f"s{i}" for i in range(16)]).stop_sequences[-1] == "s15"
    error = parse(stop_sequences=[f"s{i}" for i in range(100)])
    assert isinstance(error, ApiError) and (error.status, error.param) == (400, "stop_sequences")
    assert error.message == "'stop_sequences' allows at most 16 strings, got 100"
    assert error.anthropic_type == "invalid_request_error"


@pytest.mark.parametrize(("field", "source"), [("regex", "[0-9]{4}"), ("lark", 'start: "yes" | "no"')])
def test_regex_and_lark_are_honoured_as_on_chat_completions(field, source):
    request = parse(**{field: source})
    assert request.constraint == ConstraintSpec(field, source, field)
    assert request.to_generation(reasoning_available=True).constraint == request.constraint
    chat = ChatCompletionRequest.parse({"messages": USER, field: source})
    assert chat.constraint == request.constraint  # the very spec the OpenAI dialects build


@pytest.mark.parametrize(
    ("fields", "param", "needle"),
    [
        ({"regex": "a", "lark": 'start: "a"'}, "lark", "'regex' and 'lark' cannot be combined"),
        (
            {"regex": "a", "output_config": {"format": {"type": "json_object"}}},
            "regex",
            "'output_config.format' and 'regex' cannot be combined",
        ),
        ({"lark": 'start: "a"', "output_format": {"type": "json_object"}}, "lark", "cannot be combined"),
        ({"regex": ["a"]}, "regex", "regex"),
        (
            {"regex": "[a-z]+", "messages": [*USER, {"role": "assistant", "content": "Yes"}]},
            "regex",
            "'regex' cannot be combined with a prefilled assistant message",
        ),
    ],
)
def test_extensions_that_cannot_apply_are_400_naming_them(fields, param, needle):
    error = parse(**fields)
    assert isinstance(error, ApiError) and (error.status, error.param) == (400, param)
    assert needle in error.message
