"""Function calling on Qwen2.5-Coder (Hermes <tool_call>) through the openai SDK on a live
server: a full round trip, forced calls (always one valid call), streamed calls, and
tool_choice "none". The other dialects are in test_tools_dialects.py."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.api.conftest import API_KEY, ASK_WEATHER, WEATHER_SCHEMA, start_lmserve

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": WEATHER_SCHEMA,
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "The time now.", "parameters": {}},
}


@pytest.fixture(scope="module")
def model_server(tmp_path_factory):
    """A server for Qwen2.5-Coder, a model with the Hermes tool convention."""
    server = start_lmserve(
        tmp_path_factory.mktemp("tools"), "models/qwen2.5-coder-0.5b-instruct.gguf", "--api-key", API_KEY
    )
    yield server
    server.stop()


def test_round_trip(oai):
    # The 0.5B coder tends to answer a plain "auto" turn with a markdown JSON block rather
    # than a <tool_call>, so the first turn forces the call; the follow-up is "auto".
    reply = oai.chat.completions.create(
        model="m",
        messages=ASK_WEATHER,
        tools=[WEATHER, TIME],
        tool_choice="required",
        max_tokens=80,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] == "Paris"
    follow_up = [
        *ASK_WEATHER,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'},
    ]
    answer = oai.chat.completions.create(
        model="m", messages=follow_up, tools=[WEATHER, TIME], max_tokens=60, temperature=0
    )
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert "21" in answer.choices[0].message.content


def test_an_auto_call_written_without_tags_is_a_call(oai):
    # Under "auto" the 0.5B coder writes the call as bare JSON, without <tool_call> tags; as
    # llama.cpp's Hermes parser does, a reply that is exactly one call is taken as the call.
    reply = oai.chat.completions.create(
        model="m", messages=ASK_WEATHER, tools=[WEATHER, TIME], max_tokens=80, temperature=0
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and choice.message.content is None
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_SCHEMA)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_calls_are_always_one_valid_call(oai, choice, temperature):
    strict = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}
    reply = oai.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Hello there!"}],
        tools=[strict, TIME],
        tool_choice=choice,
        max_tokens=80,
        temperature=temperature,
        seed=11,
    )
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls" and len(message.tool_calls) == 1
    call = message.tool_calls[0].function
    if isinstance(choice, dict):
        assert call.name == "get_weather"
    if call.name == "get_weather":
        jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)


def test_streamed_tool_call(oai):
    calls, reason = [], None
    stream = oai.chat.completions.create(
        model="m",
        messages=ASK_WEATHER,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=80,
        temperature=0,
        stream=True,
    )
    for chunk in stream:
        for choice in chunk.choices:
            calls += choice.delta.tool_calls or []
            reason = choice.finish_reason or reason
    assert reason == "tool_calls" and len(calls) == 1
    assert calls[0].function.name == "get_weather" and calls[0].id
    json.loads(calls[0].function.arguments)


def test_tool_choice_none_hides_the_tools(oai):
    reply = oai.chat.completions.create(
        model="m", messages=ASK_WEATHER, tools=[WEATHER], tool_choice="none", max_tokens=20, temperature=0
    )
    assert reply.choices[0].finish_reason in ("stop", "length") and not reply.choices[0].message.tool_calls


def test_forced_call_with_a_format_is_400(oai):
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(
            model="m",
            messages=ASK_WEATHER,
            tools=[WEATHER],
            tool_choice="required",
            response_format={"type": "json_object"},
            max_tokens=8,
        )
    assert "cannot be combined" in err.value.message
