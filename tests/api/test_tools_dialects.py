"""Function calling on the Responses and Anthropic Messages dialects, through the real SDKs on
live servers: Qwen2.5-Coder (Hermes <tool_call>) for round trips, streamed calls and forced
calls (always one call whose arguments match the schema), and the default SmolLM2 (no tool
convention), where Anthropic tools are accepted and dropped while Responses tools are a 400.
The frameworks' default loops (the anthropic tool runner, the OpenAI Agents SDK) run here too."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from tests.api.conftest import (
    API_KEY,
    ASK_WEATHER,
    WEATHER_SCHEMA,
    anthropic_client,
    anthropic_text,
    openai_client,
    start_lmserve,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

DESCRIPTION = "Current weather in a city."
FUNCTIONS = [
    {"type": "function", "name": "get_weather", "description": DESCRIPTION, "parameters": WEATHER_SCHEMA},
    {"type": "function", "name": "get_time", "description": "The time now.", "parameters": {}},
]
ANTHROPIC_TOOLS = [
    {"name": "get_weather", "description": DESCRIPTION, "input_schema": WEATHER_SCHEMA},
    {"name": "get_time", "description": "The time now.", "input_schema": {"type": "object"}},
]
RESULT = '{"temperature": 21, "sky": "sunny"}'


@pytest.fixture(scope="module")
def model_server(tmp_path_factory):
    """A server for Qwen2.5-Coder, a model with the Hermes tool convention."""
    server = start_lmserve(
        tmp_path_factory.mktemp("tools-dialects"),
        "models/qwen2.5-coder-0.5b-instruct.gguf",
        "--api-key",
        API_KEY,
    )
    yield server
    server.stop()


def calls_of(response) -> list:
    return [item for item in response.output if item.type == "function_call"]


# -- Responses -----------------------------------------------------------------------------------
def test_responses_round_trip(oai):
    # As on Chat, the 0.5B coder answers an "auto" turn in markdown: the first turn forces the call.
    first = oai.responses.create(
        model="m",
        input=ASK_WEATHER,
        tools=FUNCTIONS,
        tool_choice="required",
        max_output_tokens=80,
        temperature=0,
    )
    (call,) = calls_of(first)
    assert [item.type for item in first.output] == ["function_call"]  # no empty message item
    assert first.status == "completed" and call.name == "get_weather"
    assert json.loads(call.arguments)["city"] == "Paris"
    follow_up = [
        *ASK_WEATHER,
        *(item.model_dump(exclude_none=True) for item in first.output),
        {"type": "function_call_output", "call_id": call.call_id, "output": RESULT},
    ]
    answer = oai.responses.create(
        model="m", input=follow_up, tools=FUNCTIONS, max_output_tokens=60, temperature=0
    )
    assert not calls_of(answer) and "21" in answer.output_text


def test_responses_streamed_call(oai):
    with oai.responses.stream(
        model="m",
        input=ASK_WEATHER,
        tools=FUNCTIONS[:1],
        tool_choice="required",
        max_output_tokens=80,
        temperature=0,
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    start = kinds.index("response.function_call_arguments.delta")
    assert kinds[start - 1] == "response.output_item.added"
    assert kinds[start + 1 : start + 3] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    (call,) = calls_of(final)
    assert call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)


@pytest.mark.parametrize(
    ("choice", "temperature"), [("required", 0.0), ({"type": "function", "name": "get_weather"}, 0.9)]
)
def test_responses_forced_calls_match_the_schema(oai, choice, temperature):
    strict = [{**FUNCTIONS[0], "strict": True}, FUNCTIONS[1]]
    reply = oai.responses.create(
        model="m",
        input="Hello there!",
        tools=strict,
        tool_choice=choice,
        max_output_tokens=80,
        temperature=temperature,
        extra_body={"seed": 5},
    )
    (call,) = calls_of(reply)
    if isinstance(choice, dict):
        assert call.name == "get_weather"
    if call.name == "get_weather":
        jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)


# -- Anthropic Messages --------------------------------------------------------------------------
def test_anthropic_round_trip(claude):
    first = claude.messages.create(
        model="m",
        max_tokens=80,
        messages=ASK_WEATHER,
        tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "any"},
        extra_body={"temperature": 0},
    )
    assert first.stop_reason == "tool_use"
    (tool_use,) = [block for block in first.content if block.type == "tool_use"]
    assert tool_use.name == "get_weather" and tool_use.input["city"] == "Paris"
    follow_up = [
        *ASK_WEATHER,
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": RESULT}]},
    ]
    answer = claude.messages.create(
        model="m", max_tokens=60, messages=follow_up, tools=ANTHROPIC_TOOLS, extra_body={"temperature": 0}
    )
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert "21" in anthropic_text(answer)


def test_anthropic_streamed_tool_use(claude):
    with claude.messages.stream(
        model="m",
        max_tokens=80,
        messages=ASK_WEATHER,
        tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body={"temperature": 0},
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds.count("input_json") == 1 and final.stop_reason == "tool_use"
    (tool_use,) = final.content
    assert tool_use.type == "tool_use" and tool_use.id.startswith("toolu_")
    jsonschema.validate(tool_use.input, WEATHER_SCHEMA)


@pytest.mark.parametrize(
    ("choice", "temperature"), [({"type": "any"}, 0.9), ({"type": "tool", "name": "get_weather"}, 0.9)]
)
def test_anthropic_forced_calls_always_match_the_schema(claude, choice, temperature):
    # No "strict" on the declaration: Anthropic forced calls enforce the input schema anyway.
    reply = claude.messages.create(
        model="m",
        max_tokens=80,
        messages=[{"role": "user", "content": "Hello there!"}],
        tools=ANTHROPIC_TOOLS,
        tool_choice=choice,
        extra_body={"temperature": temperature},
    )
    (tool_use,) = reply.content
    assert reply.stop_reason == "tool_use"
    if choice["type"] == "tool":
        assert tool_use.name == "get_weather"
    if tool_use.name == "get_weather":
        jsonschema.validate(tool_use.input, WEATHER_SCHEMA)


def test_anthropic_tool_runner_round_trip(claude, model_server):
    # anthropic 2.x's runner threads by default; refused, it resends whole, unthreaded turns.
    asked = []

    @anthropic.beta_tool
    def get_weather(city: str, unit: str) -> str:
        """Current weather in a city.

        Args:
            city: The city.
            unit: celsius or fahrenheit.
        """
        asked.append(city)
        return RESULT

    logged = len(model_server.logs())
    runner = claude.beta.messages.tool_runner(
        model="m",
        max_tokens=80,
        messages=ASK_WEATHER,
        tools=[get_weather],
        max_iterations=3,
        extra_body={"temperature": 0},
    )
    final = runner.until_done()
    assert asked == ["Paris"]  # the auto turn's call ran (written without tags by this model)
    assert final.stop_reason in ("end_turn", "max_tokens") and "21" in anthropic_text(final)
    statuses = [
        line.split()[2] for line in model_server.logs()[logged:].splitlines() if "POST /v1/messages" in line
    ]
    assert statuses == ["400", "200", "200"]  # thread refused, then two whole turns


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
def test_openai_agents_tool_loop(model_server, api):
    # The Agents SDK's default loop: tool_choice auto, the call run, the answer from its result.
    set_tracing_disabled(True)  # it would upload traces to OpenAI
    asked = []

    @function_tool
    def get_weather(city: str, unit: str) -> str:
        """Current weather in a city.

        Args:
            city: The city.
            unit: celsius or fahrenheit.
        """
        asked.append(city)
        return RESULT

    client = openai.AsyncOpenAI(
        base_url=model_server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=600
    )
    model = (OpenAIChatCompletionsModel if api == "chat_completions" else OpenAIResponsesModel)("m", client)
    settings = ModelSettings(temperature=0, max_tokens=80)
    agent = Agent(name="weather", tools=[get_weather], model=model, model_settings=settings)
    result = Runner.run_sync(agent, ASK_WEATHER[0]["content"], max_turns=3)
    assert asked == ["Paris"] and "21" in result.final_output
    messages = [item for item in result.new_items if item.type == "message_output_item"]
    assert [item.type for item in result.new_items][0] == "tool_call_item"  # no empty message first
    assert all(item.raw_item.content for item in messages)


# -- a model without a tool convention -----------------------------------------------------------
def test_smollm2_drops_anthropic_tools_but_refuses_responses_tools(idle_server):
    history = [
        *ASK_WEATHER,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": RESULT}]},
    ]
    with anthropic_client(idle_server) as client:
        reply = client.messages.create(
            model="m", max_tokens=8, messages=history, tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"}
        )
    assert reply.stop_reason in ("end_turn", "max_tokens") and reply.content[0].type == "text"
    with openai_client(idle_server) as client:
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="m", input=ASK_WEATHER, tools=FUNCTIONS, max_output_tokens=8)
    assert err.value.body["param"] == "tools"
