"""Reasoning routing end to end: a synthetic qwen3 model that answers with a think block,
served live and read through the SDKs in all three dialects, streamed and not; the think
block is split off (and dropped) with reasoning off too, and stop strings act on the reply
text, never on the think block or a call's JSON."""

from __future__ import annotations

import json

import pytest

from tests.api.conftest import (
    API_KEY,
    ASK_WEATHER,
    WEATHER_SCHEMA,
    anthropic_client,
    anthropic_text,
    chat_stream_text,
    openai_client,
    responses_stream_text,
    start_lmserve,
)
from tests.fixtures.think_gguf import ANSWER_TEXT, STRAY_CLOSE_REPLY, THINK_TEXT, think_model_path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ASK = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def model_server(synthetic_dir, tmp_path_factory):
    """A server for the synthetic thinking model."""
    model = think_model_path(synthetic_dir)
    server = start_lmserve(tmp_path_factory.mktemp("think"), str(model), "--api-key", API_KEY, "--ctx", "512")
    yield server
    server.stop()


def test_chat_reasoning_content(oai):
    reply = oai.chat.completions.create(
        model="m", messages=ASK, max_tokens=40, temperature=0, reasoning_effort="low"
    )
    message = reply.choices[0].message
    assert (message.content, message.model_extra["reasoning_content"]) == (ANSWER_TEXT, THINK_TEXT)
    assert reply.usage.completion_tokens_details.reasoning_tokens > 0
    stream = oai.chat.completions.create(
        model="m", messages=ASK, max_tokens=40, temperature=0, reasoning_effort="high", stream=True
    )
    chunks = list(stream)
    reasoning, content = chat_stream_text(chunks, "reasoning_content"), chat_stream_text(chunks)
    assert (reasoning, content) == (THINK_TEXT, ANSWER_TEXT)


def test_reasoning_off_drops_the_think_block(oai, claude):
    reply = oai.chat.completions.create(model="m", messages=ASK, max_tokens=40, temperature=0)
    assert reply.choices[0].message.content == ANSWER_TEXT
    assert "reasoning_content" not in reply.choices[0].message.model_extra
    stream = oai.chat.completions.create(model="m", messages=ASK, max_tokens=40, temperature=0, stream=True)
    chunks = list(stream)
    assert (chat_stream_text(chunks), chat_stream_text(chunks, "reasoning_content")) == (ANSWER_TEXT, "")
    response = oai.responses.create(model="m", input="Hi", max_output_tokens=40, temperature=0)
    assert [item.type for item in response.output] == ["message"] and response.output_text == ANSWER_TEXT
    message = claude.messages.create(model="m", max_tokens=40, messages=ASK)
    assert [block.type for block in message.content] == ["text"] and message.content[0].text == ANSWER_TEXT


def test_a_stop_string_inside_the_think_block_does_not_end_the_reply(oai, claude):
    reply = oai.chat.completions.create(
        model="m", messages=ASK, max_tokens=40, temperature=0, reasoning_effort="low", stop=["see", "nice"]
    )
    message = reply.choices[0].message
    assert (message.model_extra["reasoning_content"], message.content) == (THINK_TEXT, "Paris is ")
    assert reply.choices[0].finish_reason == "stop"
    stops = ["see", "nice"]
    with claude.messages.stream(model="m", max_tokens=40, messages=ASK, stop_sequences=stops) as stream:
        final = stream.get_final_message()
    assert anthropic_text(final) == "Paris is "
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "nice")


def test_a_stop_string_inside_a_call_does_not_end_the_reply(oai):
    # The synthetic model writes whatever the grammar leaves it; the forced call's unit is an
    # enum, so a stop string on both values sits inside the call's JSON whatever it picks.
    function = {"name": "get_weather", "parameters": WEATHER_SCHEMA, "strict": True}
    tool = {"type": "function", "function": function}
    reply = oai.chat.completions.create(
        model="m",
        messages=ASK_WEATHER,
        tools=[tool],
        tool_choice="required",
        max_tokens=80,
        temperature=0,
        stop=["celsius", "fahrenheit"],
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    arguments = json.loads(choice.message.tool_calls[0].function.arguments)
    assert arguments["unit"] in ("celsius", "fahrenheit")


def test_a_constraint_forces_reasoning_off(oai):
    reply = oai.chat.completions.create(
        model="m",
        messages=ASK,
        max_tokens=40,
        temperature=0,
        reasoning_effort="high",
        extra_body={"regex": "ok"},
    )
    assert reply.choices[0].message.content == "ok"
    assert "reasoning_content" not in reply.choices[0].message.model_extra


def test_responses_reasoning_item(oai):
    response = oai.responses.create(
        model="m", input="Hi", max_output_tokens=40, temperature=0, reasoning={"effort": "medium"}
    )
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message"] and response.output_text == ANSWER_TEXT
    assert response.output[0].content[0].text == THINK_TEXT
    with oai.responses.stream(
        model="m", input="Hi", max_output_tokens=40, temperature=0, reasoning={"effort": "medium"}
    ) as stream:
        events = list(stream)
    reasoning, text = responses_stream_text(events, "reasoning_text"), responses_stream_text(events)
    assert (reasoning, text) == (THINK_TEXT, ANSWER_TEXT)


def test_anthropic_thinking_block(claude):
    thinking = {"type": "enabled", "budget_tokens": 1024}
    message = claude.messages.create(model="m", max_tokens=40, messages=ASK, thinking=thinking)
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert (message.content[0].thinking, message.content[1].text) == (THINK_TEXT, ANSWER_TEXT)
    with claude.messages.stream(model="m", max_tokens=40, messages=ASK, thinking=thinking) as stream:
        final = stream.get_final_message()
    assert (final.content[0].thinking, final.content[1].text) == (THINK_TEXT, ANSWER_TEXT)


@pytest.fixture(scope="module")
def stray_close_server(synthetic_dir, tmp_path_factory):
    """A server for the variant that opens its reply with a stray </think>."""
    model = think_model_path(synthetic_dir, reply=STRAY_CLOSE_REPLY)
    server = start_lmserve(tmp_path_factory.mktemp("stray"), str(model), "--api-key", API_KEY, "--ctx", "512")
    yield server
    server.stop()


@pytest.mark.parametrize("effort", ["none", "high"])
def test_a_stray_leading_close_marker_is_dropped(stray_close_server, effort):
    with openai_client(stray_close_server) as client:
        chunks = list(
            client.chat.completions.create(
                model="m", messages=ASK, max_tokens=40, temperature=0, reasoning_effort=effort, stream=True
            )
        )
    assert (chat_stream_text(chunks), chat_stream_text(chunks, "reasoning_content")) == (ANSWER_TEXT, "")
    with anthropic_client(stray_close_server) as claude:
        message = claude.messages.create(model="m", max_tokens=40, messages=ASK)
    assert anthropic_text(message) == ANSWER_TEXT
