"""Chat Completions request validation and encoders, without a server."""

import pytest

from api.auth import check_api_key
from api.errors import ApiError
from api.protocol.anthropic import MessagesRequest
from api.protocol.chat import ChatCompletionRequest, ChatEncoder
from api.protocol.fields import parse_json_object
from api.protocol.responses import ResponsesRequest
from inference.engine.sampler import SamplingParams
from inference.types import Message, SamplingOverrides, Usage

USER = [{"role": "user", "content": "hi"}]


def parse(**fields):
    return ChatCompletionRequest.parse({"messages": USER, **fields})


def test_full_request_maps_onto_the_generation_request():
    request = parse(
        model="anything",
        temperature=0.5,
        top_p=0.9,
        max_completion_tokens=7,
        max_tokens=99,
        stop="##",
        seed=-3,
        presence_penalty=0.1,
        frequency_penalty=-0.2,
        top_k=5,
        min_p=0.05,
        repeat_penalty=1.1,
        stream=True,
        stream_options={"include_usage": True},
        metadata={"x": 1},
        user="u",
        store=False,
        service_tier="auto",
        parallel_tool_calls=True,
        tool_choice="none",
        response_format={"type": "text"},
        n=1,
        logprobs=False,
        some_future_field=1,
    )
    assert isinstance(request, ChatCompletionRequest)
    assert request.stream and request.include_usage
    generation = request.to_generation(False)
    assert generation.max_tokens == 7  # max_completion_tokens wins
    assert generation.stop == ("##",)
    params = generation.sampling.resolve(SamplingParams(temperature=0.8, top_k=40, repeat_last_n=64))
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.5, 0.9, 5, 0.05)
    assert params.seed == (1 << 64) - 3 and params.repeat_last_n == 64


def test_absent_sampling_fields_keep_the_model_defaults():
    defaults = SamplingParams(temperature=0.7, top_k=20, top_p=0.8)
    assert parse().to_generation(False).sampling.resolve(defaults) == defaults


SAMPLING = {
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 5,
    "min_p": 0.05,
    "repeat_penalty": 1.1,
    "presence_penalty": 0.1,
    "frequency_penalty": -0.2,
    "seed": 3,
}


@pytest.mark.parametrize(
    ("request_type", "body", "honored"),
    [
        (ChatCompletionRequest, {"messages": USER}, SAMPLING),
        (ResponsesRequest, {"input": "hi"}, SAMPLING),
        (
            MessagesRequest,
            {"max_tokens": 4, "messages": USER},
            {"temperature": 0.5, "top_p": 0.9, "top_k": 5},
        ),
    ],
)
def test_every_honored_sampling_field_reaches_the_generation_request(request_type, body, honored):
    # The dialects share one reader of their sampling fields: each must arrive under its own name,
    # and a field a dialect ignores (Anthropic has no seed or penalties) must stay unset.
    generation = request_type.parse({**body, **SAMPLING}).to_generation(False)
    assert generation.sampling == SamplingOverrides(**honored)


def test_message_shapes():
    request = ChatCompletionRequest.parse(
        {
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": None},
                {"role": "tool", "content": "42", "tool_call_id": "call_1"},
            ]
        }
    )
    assert request.messages == (
        Message("system", "be brief"),
        Message("user", "ab"),
        Message("assistant", ""),
        Message("tool", "42", tool_call_id="call_1"),
    )


@pytest.mark.parametrize(
    ("fields", "status", "param"),
    [
        ({"n": 2}, 400, "n"),
        ({"top_logprobs": 2}, 400, "top_logprobs"),
        ({"top_logprobs": 2, "logprobs": False}, 400, "top_logprobs"),
        ({"top_logprobs": 21, "logprobs": True}, 400, "top_logprobs"),
        ({"logprobs": "yes"}, 400, "logprobs"),
        ({"logit_bias": {"1": 5}}, 400, "logit_bias"),
        ({"functions": [{"name": "f"}]}, 400, "functions"),
        ({"function_call": "auto"}, 400, "function_call"),
        ({"audio": {"voice": "x"}}, 400, "audio"),
        ({"tools": [{"type": "function", "function": {}}]}, 400, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, 400, "tools[0].type"),
        ({"tool_choice": "required"}, 400, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400, "tool_choice"),
        ({"reasoning_effort": "extreme"}, 400, "reasoning_effort"),
        ({"temperature": 2.5}, 400, "temperature"),
        ({"temperature": "hot"}, 400, "temperature"),
        ({"temperature": True}, 400, "temperature"),
        ({"top_p": -0.1}, 400, "top_p"),
        ({"max_tokens": 0}, 400, "max_tokens"),
        ({"max_tokens": 1.5}, 400, "max_tokens"),
        ({"seed": "1"}, 400, "seed"),
        ({"stream": "yes"}, 400, "stream"),
        ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ({"stop": [1]}, 400, "stop"),
        ({"stop": ""}, 400, "stop"),
        ({"presence_penalty": 3}, 400, "presence_penalty"),
        ({"repeat_penalty": 0}, 400, "repeat_penalty"),
        ({"stream_options": {"include_usage": "yes"}}, 400, "stream_options.include_usage"),
        ({"messages": []}, 400, "messages"),
        ({"messages": "hi"}, 400, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, 400, "messages[0].content"),
        ({"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            400,
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
            400,
            "messages[0].content[0].type",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "file"}]}]}, 400, "messages[0].content[0].type"),
        (
            {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}]},
            400,
            "messages[0].tool_calls[0].function",
        ),
    ],
)
def test_rejections_name_the_parameter(fields, status, param):
    error = ChatCompletionRequest.parse({"messages": USER, **fields})
    assert isinstance(error, ApiError)
    assert (error.status, error.param) == (status, param)
    assert param.split(".")[0].split("[")[0] in error.message


def part(kind) -> list[dict]:
    """One user message whose only content part has ``type`` set to ``kind``."""
    return [{"role": "user", "content": [{"type": kind, "text": "hi"}]}]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": [{"role": [], "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": {"a": 1}, "content": "hi"}]}, "messages[0].role"),
        ({"messages": [*USER, {"role": ["assistant"], "content": "x"}]}, "messages[1].role"),
        ({"messages": part([])}, "messages[0].content[0].type"),
        ({"messages": part({"type": "text"})}, "messages[0].content[0].type"),
        ({"tools": [{"type": ["function"], "function": {"name": "f"}}]}, "tools[0].type"),
        ({"response_format": {"type": ["json_object"]}}, "response_format.type"),
        ({"reasoning_effort": {"level": "high"}}, "reasoning_effort"),
    ],
)
def test_a_non_string_role_or_type_is_invalid_type_not_a_crash(fields, param):
    """Roles and ``type`` tags are looked up in tables; an array or object there (unhashable)
    is a 400 naming the parameter."""
    error = ChatCompletionRequest.parse({"messages": USER, **fields})
    assert isinstance(error, ApiError)
    assert (error.status, error.type, error.code, error.param) == (
        400,
        "invalid_request_error",
        "invalid_type",
        param,
    )
    assert f"'{param}'" in error.message and "expected a string" in error.message


@pytest.mark.parametrize(
    "fields",
    [
        {"tool_choice": []},
        {"tool_choice": {"type": ["function"]}},
        {
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": []}},
        },
        {"modalities": [["text"]]},
    ],
)
def test_odd_tool_choice_and_modalities_values_are_400_naming_the_parameter(fields):
    error = ChatCompletionRequest.parse({"messages": USER, **fields})
    assert isinstance(error, ApiError) and error.status == 400
    assert error.param == next(iter(fields.keys() - {"tools"}))


@pytest.mark.parametrize("name", ["temperature", "top_p", "min_p", "presence_penalty", "repeat_penalty"])
@pytest.mark.parametrize("value", [10**400, -(10**400)], ids=["huge", "minus-huge"])
def test_integers_beyond_float_range_are_out_of_range_not_a_crash(name, value):
    error = ChatCompletionRequest.parse({"messages": USER, name: value})
    assert isinstance(error, ApiError)
    assert (error.status, error.code, error.param) == (400, "invalid_value", name)


@pytest.mark.parametrize("body", [b"", b"{", b"[1, 2]", b'"text"', b"\xff\xfe", b"[" * 100000])
def test_bodies_that_are_not_a_json_object_are_400(body):
    error = parse_json_object(body)
    assert isinstance(error, ApiError) and error.status == 400


def test_missing_messages():
    error = ChatCompletionRequest.parse({"model": "x"})
    assert error.status == 400 and error.param == "messages" and error.code == "missing_required_parameter"


def test_stream_chunks_carry_role_first_and_usage_last():
    encoder = ChatEncoder("m")
    first, second = encoder.delta_chunk("He"), encoder.delta_chunk("llo")
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "He"}
    assert second["choices"][0]["delta"] == {"content": "llo"}
    assert encoder.finish_chunk("length")["choices"][0]["finish_reason"] == "length"
    usage = encoder.usage_chunk(Usage(5, 2, cached_tokens=3))
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 3},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    assert first["id"] == usage["id"] and first["object"] == "chat.completion.chunk"


def test_api_key_headers():
    assert check_api_key(None, []) is None
    assert check_api_key("k", [(b"authorization", b"Bearer k")]) is None
    assert check_api_key("k", [(b"x-api-key", b"k")]) is None
    assert check_api_key("k", [(b"authorization", b"Bearer nope")]).status == 401
    assert check_api_key("k", [(b"authorization", b"Basic k")]).status == 401
    assert check_api_key("k", []).status == 401
