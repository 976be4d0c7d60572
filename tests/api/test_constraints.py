"""Constrained output through the SDKs on live servers: JSON schemas in every dialect's
shape, json_object, openai's parse() with a pydantic model, the regex and lark extensions,
and the 400s for grammars llguidance rejects. Every constrained reply is validated."""

from __future__ import annotations

import json
import re

import anthropic
import jsonschema
import openai
import pydantic
import pytest

from tests.api.conftest import API_KEY, start_lmserve
from tests.api.schemas import SCHEMAS
from tests.fixtures.model_files import default_model_path, optional_model_path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MODELS = {
    "smollm2": str(default_model_path()),
    "qwen2.5-coder": str(optional_model_path("qwen2.5-coder-0.5b-instruct.gguf")),
    "gemma3-270m": str(optional_model_path("gemma-3-270m-q4_k_m.gguf")),
}
BUDGET = 96
# Every model, Gemma 3 270M included: greedy decoding inside an open number used to write digits
# until the budget ran out ('{"celsius":10.5000000...'); the grammar now bounds number digits.
SWEEP_MODELS = list(MODELS)
# Asked for a tiny object under json_object (any object), the Gemma 3 270M base model writes
# key after key ('{"id":1,"name":"1","age":1,...') until the budget runs out, as llama.cpp's
# JSON grammar on the same prompt does too: an open object has no end the grammar can force.
OPEN_OBJECT_MODELS = ["smollm2", "qwen2.5-coder"]


@pytest.fixture(scope="module", params=list(MODELS))
def model_server(request, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp(f"constraints-{request.param}")
    server = start_lmserve(log_dir, MODELS[request.param], "--api-key", API_KEY, "--ctx", "1024")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def oai(model_server):
    with openai.OpenAI(base_url=model_server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=600) as c:
        yield c


def chat_json(client, prompt: str, schema: dict, temperature: float, stream: bool) -> tuple[str, str]:
    """The reply text and finish reason of a json_schema-constrained chat request."""
    kwargs = dict(
        model="m",
        messages=[{"role": "user", "content": prompt + " Answer in JSON."}],
        max_tokens=BUDGET,
        temperature=temperature,
        seed=7,
        response_format={"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}},
    )
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        return choice.message.content, choice.finish_reason
    text, reason = [], None
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            reason = choice.finish_reason or reason
    return "".join(text), reason


@pytest.mark.parametrize("model_server", SWEEP_MODELS, indirect=True)
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_twenty_schemas_give_valid_replies(oai, temperature):
    for i, (name, prompt, schema) in enumerate(SCHEMAS):
        text, reason = chat_json(oai, prompt, schema, temperature, stream=i % 2 == 1)
        assert reason == "stop", f"{name}: ran out of budget: {text!r}"
        jsonschema.validate(json.loads(text), schema), name


@pytest.mark.parametrize("model_server", OPEN_OBJECT_MODELS, indirect=True)
def test_json_object(oai):
    reply = oai.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": 'Reply with exactly this JSON: {"ok": true}'}],
        max_tokens=BUDGET,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


@pytest.mark.parametrize("model_server", SWEEP_MODELS, indirect=True)
def test_responses_text_format(oai):
    schema = SCHEMAS[0][2]
    fmt = {"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}}
    response = oai.responses.create(model="m", input="Describe a person.", max_output_tokens=BUDGET, text=fmt)
    jsonschema.validate(json.loads(response.output_text), schema)
    with oai.responses.stream(model="m", input="A person.", max_output_tokens=BUDGET, text=fmt) as stream:
        streamed = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
    jsonschema.validate(json.loads(streamed), schema)


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    population: int = pydantic.Field(ge=0, le=10**8)
    coastal: bool


def test_openai_parse_with_pydantic(oai):
    completion = oai.chat.completions.parse(
        model="m",
        messages=[{"role": "user", "content": "Describe Paris."}],
        max_tokens=BUDGET,
        temperature=0,
        response_format=City,
    )
    assert isinstance(completion.choices[0].message.parsed, City)


def test_regex_and_lark_extensions(oai):
    date = r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"
    for temperature in (0.0, 0.9):
        reply = oai.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "A date?"}],
            max_tokens=BUDGET,
            temperature=temperature,
            extra_body={"regex": date},
        )
        assert re.fullmatch(date, reply.choices[0].message.content)
    lark = 'start: answer " because " reason\nanswer: "yes" | "no"\nreason: /[a-z ]{1,20}/'
    reply = oai.responses.create(
        model="m", input="Is water wet?", max_output_tokens=BUDGET, extra_body={"lark": lark}
    )
    assert re.fullmatch(r"(yes|no) because [a-z ]{1,20}", reply.output_text)


def test_anthropic_output_config_format(model_server):
    schema = SCHEMAS[6][2]
    claude = anthropic.Anthropic(base_url=model_server.url, api_key=API_KEY, max_retries=0, timeout=600)
    fmt = {"output_config": {"format": {"type": "json_schema", "schema": schema}}}
    message = claude.messages.create(
        model="m",
        max_tokens=BUDGET,
        messages=[{"role": "user", "content": "Name a city and its country."}],
        extra_body=fmt,
    )
    assert message.stop_reason == "end_turn"
    jsonschema.validate(json.loads(message.content[-1].text), schema)
    with claude.messages.stream(
        model="m", max_tokens=BUDGET, messages=[{"role": "user", "content": "A city."}], extra_body=fmt
    ) as stream:
        jsonschema.validate(json.loads(stream.get_final_text()), schema)


def test_anthropic_regex_and_lark_extensions_as_on_the_openai_dialects(model_server):
    """/v1/messages used to drop both silently, even malformed; they now go through the same
    parser and grammar check as Chat Completions (a 400 in Anthropic's envelope when invalid)."""
    claude = anthropic.Anthropic(base_url=model_server.url, api_key=API_KEY, max_retries=0, timeout=600)
    date = r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"
    ask = {"model": "m", "max_tokens": BUDGET, "messages": [{"role": "user", "content": "A date?"}]}
    message = claude.messages.create(**ask, extra_body={"regex": date, "temperature": 0})
    assert message.stop_reason == "end_turn" and re.fullmatch(date, message.content[-1].text)
    lark = 'start: answer " because " reason\nanswer: "yes" | "no"\nreason: /[a-z ]{1,20}/'
    with claude.messages.stream(**ask, extra_body={"lark": lark}) as stream:
        assert re.fullmatch(r"(yes|no) because [a-z ]{1,20}", stream.get_final_text())
    for extra, needle in (({"regex": "(("}, "invalid 'regex'"), ({"lark": "start: nothing"}, "unknown name")):
        with pytest.raises(anthropic.BadRequestError) as err:
            claude.messages.create(**{**ask, "max_tokens": 4}, extra_body=extra)
        assert err.value.body["error"]["type"] == "invalid_request_error"
        assert needle in err.value.body["error"]["message"]


def test_budget_always_bounds_a_constrained_reply(oai):
    reply = oai.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Count."}],
        max_tokens=5,
        extra_body={"regex": "[0-9]{40}"},  # cannot complete within the budget
    )
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 5


@pytest.mark.parametrize(
    ("extra", "param", "needle"),
    [
        ({"regex": "(ab"}, "regex", "unclosed group"),
        ({"lark": "start: nothing"}, "lark", "unknown name"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}},
            "response_format.json_schema.schema",
            "type",
        ),
        ({"regex": "a", "lark": 'start: "a"'}, "lark", "cannot be combined"),
        ({"regex": "a", "response_format": {"type": "json_object"}}, "regex", "cannot be combined"),
    ],
)
def test_invalid_constraints_are_400_with_the_reason(oai, extra, param, needle):
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], max_tokens=4, extra_body=extra
        )
    assert err.value.param == param and needle in err.value.message
