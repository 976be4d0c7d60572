"""Our Chat Completions objects and chunks, Response objects, Responses stream events and
error bodies validate against OpenAI's published OpenAPI component schemas.

The schemas are a fixture extracted from github.com/openai/openai-openapi by
``scripts/extract_openapi_schemas.py`` (source and commit recorded in it), so this runs
offline; re-extract it to follow the published shape. Where the shape had moved on (the
Response usage now requires ``input_tokens_details.cache_write_tokens``; ``usage`` and
``user`` are not nullable) the encoders follow it. The encoders build exactly what the server
sends; the live-server test in test_clients_live.py validates real replies as well.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from api.errors import ApiError, bad_request
from api.protocol.chat import ChatEncoder
from api.protocol.responses import ResponsesRequest
from api.protocol.responses.encoder import ResponsesEncoder
from inference.generation.toolcall import ToolCall
from inference.types import (
    ContextOverflow,
    Error,
    Finish,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    Usage,
)
from tests.api.conftest import encode

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "openai_openapi_schemas.json"
DOCUMENT = json.loads(FIXTURE.read_text())
REGISTRY = Registry().with_resource("urn:openai", Resource.from_contents(DOCUMENT, DRAFT202012))
USAGE = Usage(prompt_tokens=30, completion_tokens=7, cached_tokens=12, reasoning_tokens=3)
CALL = ToolCallDelta(ToolCall("get_weather", '{"city": "Paris"}'), 0)
FUNCTION = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
# A token with two alternatives, and one that is half a code point.
HEL = TokenLogprob(b"Hel", -0.25, (TokenLogprob(b"Hel", -0.25), TokenLogprob(b"Hi", -1.5)))
HALF = TokenLogprob(b"\xc3", -3.0, (TokenLogprob(b"\xc3", -3.0),))


def validator(component: str) -> jsonschema.Draft202012Validator:
    schema = {"$ref": f"urn:openai#/components/schemas/{component}"}
    return jsonschema.Draft202012Validator(schema, registry=REGISTRY)


def errors_of(component: str, instance: dict) -> list[str]:
    """Every violation, as 'path: message' (empty when valid)."""
    found = validator(component).iter_errors(instance)
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in found)


def stream_event_components() -> dict[str, str]:
    """ResponseStreamEvent's members by the event type each one carries (validating against
    the member, not the whole union, names the field that is wrong)."""
    schemas = DOCUMENT["components"]["schemas"]
    members = {}
    for member in schemas["ResponseStreamEvent"]["anyOf"]:
        name = member["$ref"].rsplit("/", 1)[1]
        kind = schemas[name].get("properties", {}).get("type", {})
        for value in kind.get("enum", [kind.get("const")]):
            members[value] = name
    return members


STREAM_EVENTS = stream_event_components()


def test_the_fixture_records_its_source():
    assert DOCUMENT["source"].startswith("https://github.com/openai/openai-openapi/blob/")
    assert DOCUMENT["commit"] in DOCUMENT["source"] and len(DOCUMENT["commit"]) == 40
    assert set(DOCUMENT["roots"]) <= set(DOCUMENT["components"]["schemas"])


def test_the_schemas_can_fail():
    assert errors_of("CreateChatCompletionResponse", {"object": "chat.completion"})
    assert errors_of("ErrorResponse", {"error": {"message": "x"}})


# -- Chat Completions ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "reason", "reasoning", "calls"),
    [
        ("Hello", "stop", "", ()),
        ("", "length", "", ()),
        ("", "tool_calls", "", (CALL,)),
        ("Sure.", "tool_calls", "think", (CALL,)),
    ],
)
def test_chat_completions_validate(text, reason, reasoning, calls):
    completion = ChatEncoder("m").completion(text, reason, USAGE, reasoning, calls)
    assert errors_of("CreateChatCompletionResponse", completion) == []
    with_logprobs = ChatEncoder("m").completion(text, reason, USAGE, reasoning, calls, (HEL, HALF))
    assert errors_of("CreateChatCompletionResponse", with_logprobs) == []


def test_chat_logprobs_are_openais_entries():
    choice = ChatEncoder("m").completion("Hel\u00e9", "stop", USAGE, logprobs=(HEL, HALF))["choices"][0]
    hel, half = choice["logprobs"]["content"]
    assert choice["logprobs"]["refusal"] is None
    assert hel == {
        "token": "Hel",
        "logprob": -0.25,
        "bytes": [72, 101, 108],
        "top_logprobs": [
            {"token": "Hel", "logprob": -0.25, "bytes": [72, 101, 108]},
            {"token": "Hi", "logprob": -1.5, "bytes": [72, 105]},
        ],
    }
    assert half["token"] == "\ufffd" and half["bytes"] == [0xC3]  # lossy text, real bytes
    chunk = ChatEncoder("m").delta_chunk("Hel", "content", (HEL,))
    assert chunk["choices"][0]["logprobs"]["content"] == [hel]
    assert ChatEncoder("m").delta_chunk("Hel")["choices"][0]["logprobs"] is None


def test_chat_chunks_validate():
    encoder = ChatEncoder("m")
    chunks = [
        encoder.role_chunk(),
        encoder.delta_chunk("Hi"),
        encoder.delta_chunk("Hel", "content", (HEL, HALF)),
        encoder.delta_chunk("hm", "reasoning_content"),
        encoder.tool_call_chunk(CALL),
        encoder.finish_chunk("tool_calls"),
        encoder.usage_chunk(USAGE),
        ChatEncoder("m").delta_chunk("first, with the role"),
        ChatEncoder("m").finish_chunk("stop"),
        ChatEncoder("m").tool_call_chunk(CALL),
    ]
    for chunk in chunks:
        assert errors_of("CreateChatCompletionStreamResponse", chunk) == [], chunk


# -- errors --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "error",
    [
        bad_request("'messages' is required", "messages", "missing_required_parameter"),
        ApiError(503, "loading", None, None, retry_after=1),
        ApiError.from_event(
            Error(400, "long", "context_length_exceeded", "messages", overflow=ContextOverflow(9, 8))
        ),
    ],
)
def test_error_bodies_validate(error):
    assert errors_of("ErrorResponse", error.openai_payload()) == []


# -- Responses -----------------------------------------------------------------------------------
SCENARIOS = {
    "text": ([TextDelta("Hel"), TextDelta("lo"), Finish("stop", USAGE)], {}),
    "reasoning": (
        [ReasoningDelta("hm"), TextDelta("Hi"), Finish("stop", USAGE)],
        {"reasoning": {"effort": "low"}},
    ),
    "empty": ([Finish("stop", USAGE)], {}),
    "budget": ([TextDelta("Hel"), Finish("length", USAGE)], {"max_output_tokens": 3}),
    "call": ([CALL, Finish("tool_calls", USAGE)], {"tools": [FUNCTION], "tool_choice": "required"}),
    "text-then-call": ([TextDelta("Ok."), CALL, Finish("tool_calls", USAGE)], {"tools": [FUNCTION]}),
    "format": ([TextDelta("{}"), Finish("stop", USAGE)], {"text": {"format": {"type": "json_object"}}}),
    "failed": ([TextDelta("Hel"), Error(500, "boom", code="internal_error")], {"instructions": "be brief"}),
    "logprobs": (
        [TextDelta("Hel", (HEL,)), TextDelta("\u00e9", (HALF,)), Finish("stop", USAGE)],
        {"include": ["message.output_text.logprobs"], "top_logprobs": 2},
    ),
}


def run(name: str) -> tuple[ResponsesEncoder, list[dict]]:
    events, fields = SCENARIOS[name]
    encoder = ResponsesEncoder("m", ResponsesRequest.parse({"input": "hi", **fields}))
    return encoder, encode(encoder, events)


@pytest.mark.parametrize("name", SCENARIOS)
def test_response_objects_validate(name):
    encoder, _ = run(name)
    assert errors_of("Response", encoder.final) == []


@pytest.mark.parametrize("name", SCENARIOS)
def test_responses_stream_events_validate(name):
    _, events = run(name)
    for event in events:
        assert errors_of(STREAM_EVENTS[event["type"]], event) == [], event["type"]
        assert errors_of("ResponseStreamEvent", event) == [], event["type"]


def test_responses_logprobs_follow_the_text_in_each_shape():
    encoder, events = run("logprobs")
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [e["logprobs"] for e in deltas] == [
        [
            {
                "token": "Hel",
                "logprob": -0.25,
                "top_logprobs": [{"token": "Hel", "logprob": -0.25}, {"token": "Hi", "logprob": -1.5}],
            }
        ],
        [{"token": "\ufffd", "logprob": -3.0, "top_logprobs": [{"token": "\ufffd", "logprob": -3.0}]}],
    ]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert done["logprobs"] == [entry for e in deltas for entry in e["logprobs"]]
    part = encoder.final["output"][0]["content"][0]
    assert [entry["bytes"] for entry in part["logprobs"]] == [[72, 101, 108], [0xC3]]
    assert part["logprobs"][0]["top_logprobs"][1] == {"token": "Hi", "logprob": -1.5, "bytes": [72, 105]}
    assert encoder.final["top_logprobs"] == 2
