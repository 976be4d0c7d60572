"""Responses request validation and the event encoder, without a server.

The encoder is also driven with synthetic event sequences that include reasoning (which no
served model produces yet) and replayed through the openai SDK's own stream state machine."""

import re

import pytest

from api.errors import ApiError
from api.protocol.responses import ResponsesRequest
from api.protocol.responses.encoder import ResponsesEncoder
from inference.engine.sampler import SamplingParams
from inference.types import Error, Finish, Message, ReasoningDelta, TextDelta, Usage
from tests.api.conftest import encode, replay_responses, responses_types

USAGE = Usage(prompt_tokens=30, completion_tokens=7, cached_tokens=12, reasoning_tokens=3)


def parse(**fields):
    return ResponsesRequest.parse({"input": "hi", **fields})


def test_full_request_maps_onto_the_generation_request():
    request = parse(
        model="anything",
        instructions="be brief",
        input=[
            {"role": "developer", "content": "use French"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "b", "annotations": []}]},
            {"role": "user", "content": "c"},
        ],
        max_output_tokens=9,
        temperature=0.3,
        top_p=0.7,
        stream=True,
        reasoning={"effort": "minimal", "summary": "auto"},
        text={"format": {"type": "text"}, "verbosity": "low"},
        store=False,
        metadata={"k": "v"},
        include=["reasoning.encrypted_content"],
        user="u",
        service_tier="auto",
        parallel_tool_calls=False,
        truncation="disabled",
        tool_choice="auto",
        top_k=4,
        seed=5,
        stop=["##"],
        some_future_field=1,
    )
    assert isinstance(request, ResponsesRequest) and request.stream
    generation = request.to_generation(reasoning_available=False)
    assert generation.messages == (
        Message("system", "be brief"),
        Message("system", "use French"),
        Message("user", "a"),
        Message("assistant", "b"),
        Message("user", "c"),
    )
    assert generation.max_tokens == 9 and generation.stop == ("##",) and not generation.reasoning
    params = generation.sampling.resolve(SamplingParams())
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (0.3, 0.7, 4, 5)


def test_string_input_is_one_user_message():
    generation = parse(input="hello").to_generation(False)
    assert generation.messages == (Message("user", "hello"),) and generation.max_tokens is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}, "tool_choice.type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, None),
    ],
)
def test_stateful_hosted_and_media_fields_are_400_naming_the_parameter(fields, param):
    error = parse(**fields)
    assert isinstance(error, ApiError) and error.status == 400
    assert error.param == (param or "input[0].content[0].type")
    assert error.code == "unsupported_parameter"


PATCH_GRAMMAR = 'start: "*** Begin Patch\\n" LINE* "*** End Patch"\nLINE: /[^\\n]*\\n/\n'
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_GRAMMAR},
}
EXEC = {"type": "function", "name": "exec_command", "parameters": {"type": "object"}, "strict": False}
AGENTS = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Sub-agents.",
    "tools": [{"type": "function", "name": "close_agent", "parameters": {"type": "object"}}],
}


def test_codex_tools_are_served_and_hosted_ones_left_out_of_the_prompt():
    """Codex CLI's first request: functions, a namespace, a custom tool and hosted tools."""
    tools = [EXEC, AGENTS, APPLY_PATCH, {"type": "web_search", "external_web_access": False}]
    request = parse(tools=tools, tool_choice="auto", parallel_tool_calls=True, store=False)
    assert [spec.name for spec in request.tools] == [
        "exec_command",
        "multi_agent_v1.close_agent",
        "apply_patch",
    ]
    patch = request.tools[2]
    assert patch.parameters["required"] == ["input"] and PATCH_GRAMMAR.strip() in patch.description
    assert request.constraint is None and request.forced_custom is None
    echoed = request.declared_tools.echo
    assert [tool["type"] for tool in echoed] == ["function", "namespace", "custom", "web_search"]
    assert echoed[2] == APPLY_PATCH and echoed[1]["tools"][0]["name"] == "close_agent"


def test_a_forced_custom_tool_constrains_the_whole_reply_by_its_grammar():
    request = parse(tools=[EXEC, APPLY_PATCH], tool_choice={"type": "custom", "name": "apply_patch"})
    assert request.forced_custom.name == "apply_patch"
    assert (request.constraint.kind, request.constraint.source) == ("lark", PATCH_GRAMMAR)
    generation = request.to_generation(False, tools_available=True)
    assert generation.tools == () and "'apply_patch'" in generation.messages[-1].content


def test_custom_and_namespaced_calls_replay_as_the_model_wrote_them():
    request = parse(
        tools=[AGENTS, APPLY_PATCH],
        input=[
            {"role": "user", "content": "go"},
            {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "done"},
            {
                "type": "function_call",
                "call_id": "c2",
                "namespace": "multi_agent_v1",
                "name": "close_agent",
                "arguments": "{}",
            },
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "ok"}],
            },
        ],
    )
    calls = [m.tool_calls[0] for m in request.input if m.tool_calls]
    assert [(c.name, c.arguments) for c in calls] == [
        ("apply_patch", '{"input": "*** Begin Patch"}'),
        ("multi_agent_v1.close_agent", "{}"),
    ]
    assert [m.content for m in request.input if m.role == "tool"] == ["done", "ok"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "custom"}]}, "tools[0].name"),
        (
            {"tools": [{**APPLY_PATCH, "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}]},
            "tools[0].format.syntax",
        ),
        (
            {"tools": [{**APPLY_PATCH, "format": {"type": "grammar", "syntax": "lark"}}]},
            "tools[0].format.definition",
        ),
        ({"tools": [{**AGENTS, "tools": [{"type": "web_search"}]}]}, "tools[0].tools[0].type"),
        ({"tools": [{"type": "teleport"}]}, "tools[0].type"),
        ({"tools": [EXEC, EXEC]}, "tools"),
        ({"tools": [EXEC], "tool_choice": {"type": "custom", "name": "exec_command"}}, "tool_choice"),
        ({"input": [{"type": "custom_tool_call", "call_id": "c", "name": "f"}]}, "input[0].input"),
    ],
)
def test_malformed_tools_are_400_naming_the_field(fields, param):
    error = parse(**fields)
    assert isinstance(error, ApiError) and (error.status, error.param) == (400, param)


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"input": None}, "input", "missing_required_parameter"),
        ({"input": []}, "input", "invalid_value"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input", "invalid_value"),
        ({"input": 3}, "input", "invalid_type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "invalid_value"),
        ({"input": [{"role": "user"}]}, "input[0].content", "missing_required_parameter"),
        ({"input": [{"type": "computer_call"}]}, "input[0].type", "invalid_value"),
        ({"temperature": 2.5}, "temperature", "invalid_value"),
        ({"max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort", "invalid_value"),
        ({"truncation": "sometimes"}, "truncation", "invalid_value"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type", "invalid_value"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
    ],
)
def test_malformed_fields_are_400(fields, param, code):
    error = parse(**fields)
    assert isinstance(error, ApiError) and (error.status, error.param, error.code) == (400, param, code)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": [{"role": [], "content": "hi"}]}, "input[0].role"),
        ({"input": [{"type": "message", "role": {"a": 1}, "content": "hi"}]}, "input[0].role"),
        ({"input": [{"type": ["message"], "role": "user", "content": "hi"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": [], "text": "hi"}]}]}, "input[0].content[0].type"),
        ({"input": [{"role": "user", "content": [{"type": {}, "text": "hi"}]}]}, "input[0].content[0].type"),
        ({"tools": [{"type": ["function"], "name": "f"}]}, "tools[0].type"),
        ({"tool_choice": {"type": ["function"], "name": "f"}}, "tool_choice.type"),
        ({"text": {"format": {"type": ["json_object"]}}}, "text.format.type"),
        ({"reasoning": {"effort": ["high"]}}, "reasoning.effort"),
    ],
)
def test_a_non_string_role_or_type_is_invalid_type_not_a_crash(fields, param):
    """An array or object where a role or ``type`` tag belongs is a 400 naming the parameter,
    never a TypeError from a table lookup (nor a misleading "hosted tool" refusal)."""
    error = parse(**fields)
    assert isinstance(error, ApiError)
    assert (error.status, error.type, error.code, error.param) == (
        400,
        "invalid_request_error",
        "invalid_type",
        param,
    )
    assert f"'{param}'" in error.message and "expected a string" in error.message


def test_integers_beyond_float_range_are_out_of_range_not_a_crash():
    error = parse(temperature=10**400)
    assert isinstance(error, ApiError) and (error.status, error.param) == (400, "temperature")


def test_reasoning_effort_needs_a_reasoning_channel():
    for effort in ("none", "minimal"):
        assert not parse(reasoning={"effort": effort}).to_generation(False).reasoning
    request = parse(reasoning={"effort": "high"})
    refused = request.to_generation(reasoning_available=False)
    assert isinstance(refused, ApiError) and (refused.status, refused.param) == (400, "reasoning.effort")
    assert request.to_generation(reasoning_available=True).reasoning


# -- the encoder ------------------------------------------------------------------------------
def run(events, request=None) -> tuple[ResponsesEncoder, list[dict]]:
    encoder = ResponsesEncoder("the-model", request or parse())
    return encoder, encode(encoder, events)


def test_reasoning_is_its_own_output_item_ahead_of_the_message():
    deltas = [ReasoningDelta("think "), ReasoningDelta("more"), TextDelta("Hel"), TextDelta("lo")]
    encoder, events = run([*deltas, Finish("stop", USAGE)])
    assert responses_types(events) == (
        "created in_progress "
        "output_item.added content_part.added reasoning_text.delta reasoning_text.delta "
        "reasoning_text.done content_part.done output_item.done "
        "output_item.added content_part.added output_text.delta output_text.delta "
        "output_text.done content_part.done output_item.done completed"
    )
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    reasoning, message = encoder.response["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"][0] == {
        "type": "reasoning_text",
        "text": "think more",
    }
    assert message["type"] == "message" and message["content"][0]["text"] == "Hello"
    assert message["status"] == reasoning["status"] == "completed"
    assert [e["output_index"] for e in events if e["type"].endswith(".delta")] == [0, 0, 1, 1]
    assert encoder.response["usage"] == {
        "input_tokens": 30,
        "input_tokens_details": {"cached_tokens": 12, "cache_write_tokens": 0},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 3},
        "total_tokens": 37,
    }
    final = replay_responses(events)._completed_response
    assert final.output_text == "Hello" and final.output[0].content[0].text == "think more"


def test_budget_end_is_incomplete_and_an_empty_reply_still_has_a_message():
    encoder, events = run([Finish("length", Usage(5, 0))])
    assert responses_types(events) == (
        "created in_progress output_item.added content_part.added "
        "output_text.done content_part.done output_item.done incomplete"
    )
    response = events[-1]["response"]
    assert response["status"] == "incomplete" and response["incomplete_details"] == {
        "reason": "max_output_tokens"
    }
    assert (
        response["output"][0]["status"] == "incomplete" and response["output"][0]["content"][0]["text"] == ""
    )
    assert response["completed_at"] is None and response is encoder.response


def test_a_failure_is_an_error_event_then_response_failed():
    _, events = run([TextDelta("partial"), Error(503, "the server is shutting down", code="shutting_down")])
    assert re.fullmatch(r"created in_progress .* output_text\.delta error failed", responses_types(events))
    error, failed = events[-2:]
    assert (error["code"], error["message"]) == ("shutting_down", "the server is shutting down")
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "server_error", "message": "the server is shutting down"}
    assert failed["response"]["output"][0]["content"][0]["text"] == "partial"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    replay_responses(events)  # the SDK's state machine accepts the failed stream


def test_response_object_echoes_the_request():
    request = parse(instructions="sys", max_output_tokens=5, temperature=0.5, reasoning={"effort": "none"})
    encoder, _ = run([TextDelta("x"), Finish("stop", USAGE)], request)
    response = encoder.response
    assert response["id"].startswith("resp_") and response["object"] == "response"
    assert (response["instructions"], response["max_output_tokens"], response["temperature"]) == (
        "sys",
        5,
        0.5,
    )
    assert response["reasoning"]["effort"] == "none" and response["model"] == "the-model"
    assert response["status"] == "completed" and response["completed_at"] >= response["created_at"]
    assert response["error"] is None and response["store"] is False
