"""Function calling on the Responses and Anthropic Messages dialects, without a server:
declarations, tool_choice, history folding and the encoders' call items / tool_use blocks
(replayed through each SDK's own stream accumulator)."""

import json

import pytest

from api.errors import ApiError
from api.protocol.anthropic import MessagesRequest
from api.protocol.anthropic.encoder import MessagesEncoder
from api.protocol.responses import ResponsesRequest
from api.protocol.responses.encoder import ResponsesEncoder
from inference.generation.toolcall import ToolCall, ToolSpec
from inference.types import Finish, Message, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from tests.api.conftest import (
    accumulate_anthropic,
    anthropic_shape,
    encode,
    replay_responses,
    responses_types,
)

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
FUNCTION = {"type": "function", "name": "get_weather", "description": "Weather.", "parameters": SCHEMA}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "Weather.", "input_schema": SCHEMA}
CALL = ToolCallDelta(ToolCall("get_weather", '{"city": "Paris"}'), 0)
USAGE = Usage(20, 6)


def responses(**fields):
    return ResponsesRequest.parse({"input": "hi", **fields})


def run_responses(events, request=None) -> tuple[ResponsesEncoder, list[dict]]:
    encoder = ResponsesEncoder("the-model", request or responses())
    return encoder, encode(encoder, events)


def messages(**fields):
    return MessagesRequest.parse(
        {"max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **fields}
    )


# -- Responses requests ------------------------------------------------------------------------
def test_responses_function_tools_and_forced_choice():
    request = responses(
        tools=[{**FUNCTION, "strict": True}], tool_choice={"type": "function", "name": "get_weather"}
    )
    assert request.tools == (ToolSpec("get_weather", "Weather.", SCHEMA, True),)
    assert request.constraint.kind == "tool_call" and request.constraint.param == "tool_choice"
    assert "get_weather" in request.constraint.source and json.dumps(SCHEMA) in request.constraint.source
    generation = request.to_generation(False, tools_available=True)
    assert generation.tools == request.tools and generation.constraint == request.constraint
    assert responses(tools=[FUNCTION], tool_choice="auto").constraint is None
    assert responses(tools=[FUNCTION], tool_choice="none").tools == ()


@pytest.mark.parametrize(
    ("fields", "status", "param"),
    [
        (
            {"tools": [{"type": "file_search"}], "tool_choice": {"type": "file_search"}},
            400,
            "tool_choice.type",
        ),
        ({"tools": [{"type": "teleport"}]}, 400, "tools[0].type"),
        ({"tools": [FUNCTION], "tool_choice": {"type": "web_search_preview"}}, 400, "tool_choice.type"),
        ({"tools": [FUNCTION], "tool_choice": {"type": "function", "name": "nope"}}, 400, "tool_choice"),
        ({"tool_choice": "required"}, 400, "tool_choice"),
        ({"tool_choice": "sometimes"}, 400, "tool_choice"),
        (
            {"tools": [FUNCTION], "tool_choice": "required", "text": {"format": {"type": "json_object"}}},
            400,
            None,
        ),
        ({"tools": [FUNCTION], "tool_choice": "required", "regex": "a+"}, 400, None),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, 400, None),
    ],
)
def test_responses_tool_errors(fields, status, param):
    error = responses(**fields)
    assert isinstance(error, ApiError) and error.status == status
    assert param is None or error.param == param


def test_responses_history_items_fold_into_calls_and_tool_messages():
    request = responses(
        tools=[FUNCTION],
        input=[
            {"role": "user", "content": "weather?"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Checking."}],
            },
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "get_weather",
                "arguments": '{"city":"Paris"}',
            },
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city":"Rome"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "21C"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "25C"}],
            },
        ],
    )
    user, assistant, first, second = request.input
    assert user == Message("user", "weather?")
    assert assistant.content == "Checking." and assistant.tool_calls == (
        ToolCall("get_weather", '{"city": "Paris"}'),
        ToolCall("get_weather", '{"city": "Rome"}'),
    )
    assert first == Message("tool", "21C", tool_call_id="c1") and second.content == "25C"


def test_responses_tools_need_a_tool_convention():
    error = responses(tools=[FUNCTION]).to_generation(False, tools_available=False)
    assert isinstance(error, ApiError) and (error.status, error.param) == (400, "tools")


# -- Responses encoder -------------------------------------------------------------------------
def test_function_call_item_follows_the_message_and_replays_through_the_sdk():
    encoder, events = run_responses([TextDelta("Let me check."), CALL, Finish("tool_calls", USAGE)])
    assert responses_types(events) == (
        "created in_progress output_item.added content_part.added output_text.delta "
        "output_text.done content_part.done output_item.done "
        "output_item.added function_call_arguments.delta function_call_arguments.done output_item.done "
        "completed"
    )
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    message, call = encoder.response["output"]
    assert message["content"][0]["text"] == "Let me check."
    assert call["type"] == "function_call" and call["name"] == "get_weather" and call["status"] == "completed"
    assert json.loads(call["arguments"]) == {"city": "Paris"} and call["call_id"].startswith("call_")
    assert events[8]["item"]["status"] == "in_progress" and events[8]["item"]["arguments"] == ""
    final = replay_responses(events)._completed_response
    assert final.status == "completed" and final.output[1].arguments == call["arguments"]


def test_a_call_only_reply_has_no_message_item():
    # As OpenAI's: the Agents SDK would show an empty message item as an empty assistant turn.
    encoder, events = run_responses([ReasoningDelta("hm"), CALL, Finish("tool_calls", USAGE)])
    assert [item["type"] for item in encoder.response["output"]] == ["reasoning", "function_call"]
    assert [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"] == [
        "reasoning",
        "function_call",
    ]
    encoder, _ = run_responses([TextDelta("Sure."), CALL, Finish("tool_calls", USAGE)])
    assert [item["type"] for item in encoder.response["output"]] == ["message", "function_call"]


def test_response_object_echoes_the_tools():
    request = responses(tools=[FUNCTION], tool_choice="required")
    encoder, _ = run_responses([CALL, Finish("tool_calls", USAGE)], request)
    assert encoder.response["tool_choice"] == "required"
    assert encoder.response["tools"][0]["name"] == "get_weather"


# -- Anthropic requests ------------------------------------------------------------------------
def test_anthropic_tools_and_forced_choice_always_enforce_the_schema():
    request = messages(tools=[ANTHROPIC_TOOL], tool_choice={"type": "tool", "name": "get_weather"})
    assert request.tools == (ToolSpec("get_weather", "Weather.", SCHEMA, False),)
    assert request.forced_call and json.dumps(SCHEMA) in request.constraint.source
    assert messages(tools=[ANTHROPIC_TOOL], tool_choice={"type": "any"}).forced_call
    assert messages(tools=[ANTHROPIC_TOOL], tool_choice={"type": "none"}).tools == ()
    auto = messages(tools=[ANTHROPIC_TOOL], tool_choice={"type": "auto"})
    assert auto.constraint is None and auto.to_generation(False, True).tools == auto.tools


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
        ({"tools": [{"name": "f"}]}, "tools[0]"),
        ({"tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
        (
            {
                "tools": [ANTHROPIC_TOOL],
                "tool_choice": {"type": "any"},
                "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}},
            },
            "tool_choice",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}]}, None),
    ],
)
def test_anthropic_tool_errors_are_400(fields, param):
    error = messages(**fields)
    assert isinstance(error, ApiError) and error.status == 400
    assert param is None or error.param == param


HISTORY = [
    {"role": "user", "content": "weather?"},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21C"}]},
            {"type": "text", "text": "And so?"},
        ],
    },
]


def test_anthropic_history_blocks_fold_into_calls_and_tool_messages():
    request = messages(tools=[ANTHROPIC_TOOL], messages=HISTORY)
    assert request.messages == (
        Message("user", "weather?"),
        Message("assistant", "Checking.", tool_calls=(ToolCall("get_weather", '{"city": "Paris"}'),)),
        Message("tool", "21C", tool_call_id="toolu_1"),
        Message("user", "And so?"),
    )


def test_anthropic_tools_are_dropped_on_a_model_without_a_tool_convention():
    request = messages(tools=[ANTHROPIC_TOOL], tool_choice={"type": "any"}, messages=HISTORY)
    generation = request.to_generation(False, tools_available=False)
    assert generation.tools == () and generation.constraint is None
    assert generation.messages == (
        Message("user", "weather?"),
        Message("assistant", "Checking."),
        Message("user", "21C"),
        Message("user", "And so?"),
    )


# -- Anthropic encoder -------------------------------------------------------------------------
def run_messages(events) -> tuple[MessagesEncoder, list[dict]]:
    encoder = MessagesEncoder("the-model")
    return encoder, encode(encoder, events)


def test_tool_use_block_streams_whole_and_accumulates_in_the_sdk():
    encoder, events = run_messages([TextDelta("Checking."), CALL, Finish("tool_calls", USAGE)])
    assert anthropic_shape(events) == [
        "message_start",
        "content_block_start",
        "text_delta",
        "content_block_stop",
        "content_block_start",
        "input_json_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[4]["content_block"]["type"] == "tool_use" and events[4]["content_block"]["input"] == {}
    text, tool_use = encoder.final["content"]
    assert text == {"type": "text", "text": "Checking."}
    assert tool_use["name"] == "get_weather" and tool_use["input"] == {"city": "Paris"}
    assert tool_use["id"].startswith("toolu_") and encoder.final["stop_reason"] == "tool_use"
    snapshot = accumulate_anthropic(events)
    assert snapshot.content[1].input == {"city": "Paris"} and snapshot.stop_reason == "tool_use"


def test_a_call_only_reply_has_no_empty_text_block():
    encoder, _ = run_messages([CALL, Finish("tool_calls", USAGE)])
    assert [block["type"] for block in encoder.final["content"]] == ["tool_use"]
