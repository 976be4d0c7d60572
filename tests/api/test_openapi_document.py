"""The OpenAPI document cannot drift from the parsers it describes.

Each request's top-level fields are declared once (``FIELDS``, api/protocol/request_fields.py)
and both its parser and its schema come from that tuple: the first test checks the schema
carries every declared field, in order, with its range, and marked refused or ignored as
declared. What stays written twice is the structure of nested fields (messages, tools,
formats: a parser in api/protocol/, a shape in api/openapi/): each parser runs on sample bodies
through a dict that records every key it reads, and every field it reads must be declared and
every declared field read (or marked ``x-lmserve-ignored``, and then never read). Each
declared top-level type, bound and enum is then tried with a value just outside it, which the
parser must refuse naming that field, and with the boundary value, which it must not refuse:
the kinds' readers and the refused fields' own readers against their schemas.
"""

from __future__ import annotations

import copy

import pytest
from jsonschema import Draft202012Validator

from api.errors import ApiError
from api.openapi.anthropic_requests import COUNT_TOKENS_REQUEST, MESSAGES_REQUEST
from api.openapi.document import build_document
from api.openapi.llamacpp_requests import DETOKENIZE_REQUEST, INFILL_REQUEST, TOKENIZE_REQUEST
from api.openapi.openai_requests import (
    CHAT_COMPLETION_REQUEST,
    COMPLETION_REQUEST,
    EMBEDDINGS_REQUEST,
    RESPONSES_REQUEST,
)
from api.protocol.anthropic import request as anthropic_request
from api.protocol.anthropic.request import MessagesRequest
from api.protocol.chat import request as chat_request
from api.protocol.chat.request import ChatCompletionRequest
from api.protocol.completions import CompletionRequest
from api.protocol.completions import request as completions_request
from api.protocol.embeddings import EmbeddingsRequest
from api.protocol.embeddings import request as embeddings_request
from api.protocol.infill import InfillRequest
from api.protocol.infill import request as infill_request
from api.protocol.request_fields import Sampling
from api.protocol.responses import request as responses_request
from api.protocol.responses.request import ResponsesRequest
from api.protocol.tokenize import DetokenizeRequest, TokenizeRequest
from api.protocol.tokenize import request as tokenize_request
from inference.types import SAMPLING_RANGES

TOOL = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {}, "strict": False}}
FLAT_TOOL = {"type": "function", "name": "f", "description": "d", "parameters": {}, "strict": False}
ANTHROPIC_TOOL = {"type": "custom", "name": "f", "description": "d", "input_schema": {}, "strict": False}
SAMPLING = {"temperature": 0.5, "top_p": 0.9, "frequency_penalty": 0, "presence_penalty": 0, "seed": 1}
EXTENSIONS = {
    "top_k": 5,
    "min_p": 0.1,
    "repeat_penalty": 1.1,
    "ignore_eos": False,
    "lark": None,
    "regex": None,
}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
CHAT_SAMPLES = [
    {
        "model": "m",
        "messages": [
            {"role": "system", "content": "s"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "b"}],
                "name": "u",
            },
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "content": "r", "tool_call_id": "c1"},
        ],
        "max_completion_tokens": 5,
        "max_tokens": 5,
        "stop": ["x"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "reasoning_effort": "none",
        "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}},
        "tools": [TOOL],
        "tool_choice": "auto",
        **SAMPLING,
        **EXTENSIONS,
        "n": 1,
        "logprobs": True,
        "top_logprobs": 0,
        "logit_bias": {},
        "modalities": ["text"],
    },
    {
        "messages": [{"role": "user", "content": "a"}],
        "response_format": {"type": "json_schema", "schema": {}},
    },
    {
        "messages": [{"role": "user", "content": "a"}],
        "tools": [TOOL],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
    },
]
RESPONSES_SAMPLES = [
    {
        "model": "m",
        "instructions": "be brief",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
            {"type": "reasoning"},
            {"type": "function_call", "name": "f", "call_id": "c1", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [{"type": "input_text", "text": "r"}],
            },
        ],
        "max_output_tokens": 5,
        "reasoning": {"effort": "none"},
        "stream": False,
        "stop": "x",
        "text": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
        "tools": [FLAT_TOOL],
        "tool_choice": "auto",
        **SAMPLING,
        **EXTENSIONS,
        "background": False,
        "truncation": "disabled",
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 0,
    },
    {"input": "a", "tools": [FLAT_TOOL], "tool_choice": {"type": "function", "name": "f"}},
    {"input": "a", "text": {"format": {"type": "json_schema", "json_schema": {"schema": {}}}}},
    {  # Codex CLI's shapes: a custom tool with a grammar, a namespace, a hosted tool
        "input": [
            {"role": "user", "content": "a"},
            {"type": "custom_tool_call", "name": "patch", "call_id": "c2", "input": "x"},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": "ok"},
            {"type": "function_call", "name": "g", "namespace": "ns", "call_id": "c3", "arguments": "{}"},
        ],
        "tools": [
            {
                "type": "custom",
                "name": "patch",
                "description": "edit",
                "format": {"type": "grammar", "syntax": "lark", "definition": "start: /x+/"},
            },
            {
                "type": "namespace",
                "name": "ns",
                "description": "d",
                "tools": [
                    {**FLAT_TOOL, "name": "g"},
                    {
                        "type": "custom",
                        "name": "h",
                        "format": {"type": "grammar", "syntax": "regex", "definition": "y+"},
                    },
                ],
            },
            {"type": "web_search"},
        ],
        "tool_choice": {"type": "custom", "name": "patch", "namespace": None},
    },
]
ANTHROPIC_MESSAGES = [
    {"role": "user", "content": [{"type": "text", "text": "a"}]},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "t"},
            {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "t1",
                "content": [{"type": "text", "text": "r"}],
                "is_error": False,
            }
        ],
    },
]
MESSAGES_SAMPLES = [
    {
        "model": "m",
        "max_tokens": 5,
        "system": [{"type": "text", "text": "s"}],
        "messages": ANTHROPIC_MESSAGES,
        "stop_sequences": ["x"],
        "stream": False,
        "temperature": 0.5,
        "top_k": 5,
        "top_p": 0.9,
        "ignore_eos": False,
        "thinking": {"type": "enabled", "budget_tokens": 100},
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
        "tools": [ANTHROPIC_TOOL],
        "tool_choice": {"type": "auto"},
    },
    {
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "a"}],
        "output_format": {"type": "json_schema", "schema": {}},
    },
    {
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "a"}],
        "output_format": {"type": "json_schema", "json_schema": {"schema": {}}},
    },
    {
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "a"}],
        "output_config": {"format": {"type": "json_schema", "json_schema": {"schema": {}}}},
    },
    {
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "a"}],
        "tools": [ANTHROPIC_TOOL],
        "tool_choice": {"type": "tool", "name": "f"},
    },
    {
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "a"}],
        "thread": {"type": "continue", "previous_message_id": "m1"},
    },
    {"max_tokens": 5, "messages": [{"role": "user", "content": "a"}], "regex": "[a-z]+"},
    {"max_tokens": 5, "messages": [{"role": "user", "content": "a"}], "lark": 'start: "a"'},
]


COMPLETION_SAMPLES = [
    {
        "model": "m",
        "prompt": "p",
        "best_of": 1,
        "echo": True,
        "logit_bias": {},
        "logprobs": 0,
        "max_tokens": 5,
        "n": 1,
        "stop": ["x"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "suffix": "s",
        "user": "u",
        **SAMPLING,
        "top_k": 5,
        "min_p": 0.1,
        "repeat_penalty": 1.1,
        "ignore_eos": False,
    },
    {"prompt": [[1, 2]]},
]
INFILL_SAMPLES = [
    {
        "input_prefix": "a",
        "input_suffix": "b",
        "input_extra": [{"filename": "f.py", "text": "t"}],
        "prompt": "p",
        "n_predict": 4,
        "stream": True,
        "stop": ["x"],
        **SAMPLING,
        "top_k": 5,
        "min_p": 0.1,
        "repeat_penalty": 1.1,
        "ignore_eos": False,
        "cache_prompt": True,
        "samplers": ["top_k"],
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 500,
        "n_indent": 4,
        "id_slot": 0,
        "response_fields": ["content"],
    },
    {"input_prefix": "a", "max_tokens": 4},
]


def parse_chat(body):
    return ChatCompletionRequest.parse(body)


def parse_responses(body):
    return ResponsesRequest.parse(body)


def parse_messages(body):
    return MessagesRequest.parse(body)


def parse_count(body):
    return MessagesRequest.parse(body, count_only=True)


def count_samples():
    return [{k: v for k, v in body.items() if k != "max_tokens"} for body in MESSAGES_SAMPLES]


DIALECTS = {
    "chat": (
        CHAT_COMPLETION_REQUEST,
        parse_chat,
        CHAT_SAMPLES,
        {"messages": [{"role": "user", "content": "hi"}]},
    ),
    "responses": (RESPONSES_REQUEST, parse_responses, RESPONSES_SAMPLES, {"input": "hi"}),
    "messages": (
        MESSAGES_REQUEST,
        parse_messages,
        MESSAGES_SAMPLES,
        {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
    ),
    "count_tokens": (
        COUNT_TOKENS_REQUEST,
        parse_count,
        count_samples(),
        {"messages": [{"role": "user", "content": "hi"}]},
    ),
    "completions": (COMPLETION_REQUEST, CompletionRequest.parse, COMPLETION_SAMPLES, {"prompt": "hi"}),
    "infill": (INFILL_REQUEST, InfillRequest.parse, INFILL_SAMPLES, {}),
    "tokenize": (
        TOKENIZE_REQUEST,
        TokenizeRequest.parse,
        [{"content": "a", "add_special": True, "parse_special": False, "with_pieces": True}],
        {"content": "hi"},
    ),
    "detokenize": (DETOKENIZE_REQUEST, DetokenizeRequest.parse, [{"tokens": [1, 2]}], {"tokens": [1]}),
    "embeddings": (
        EMBEDDINGS_REQUEST,
        EmbeddingsRequest.parse,
        [{"input": ["a", "b"], "model": "m", "encoding_format": "base64", "dimensions": 576}],
        {"input": "hi"},
    ),
}


# Each request schema is built from its dialect's field declaration.
DECLARATIONS = {
    "chat": chat_request.FIELDS,
    "responses": responses_request.FIELDS,
    "messages": anthropic_request.FIELDS,
    "count_tokens": anthropic_request.COUNT_TOKENS_FIELDS,
    "completions": completions_request.FIELDS,
    "infill": infill_request.FIELDS,
    "tokenize": tokenize_request.TOKENIZE_FIELDS,
    "detokenize": tokenize_request.DETOKENIZE_FIELDS,
    "embeddings": embeddings_request.FIELDS,
}


@pytest.mark.parametrize("dialect", DECLARATIONS)
def test_every_declared_field_is_in_the_schema_in_order_with_its_range(dialect):
    schema, declared = DIALECTS[dialect][0], DECLARATIONS[dialect]
    assert list(schema["properties"]) == [field.name for field in declared]
    assert schema.get("required", []) == [field.name for field in declared if field.required]
    for field in declared:
        sub = schema["properties"][field.name]
        assert bool(sub.get("x-lmserve-refused")) == (field.refused is not None), field.name
        assert bool(sub.get("x-lmserve-ignored")) == field.ignored, field.name
        if isinstance(field.kind, Sampling):
            allowed = SAMPLING_RANGES[field.name]
            low = "exclusiveMinimum" if allowed.lowest_excluded else "minimum"
            assert sub.get(low) == allowed.lowest, field.name
            if field.name != "temperature":  # Anthropic caps it at 1
                assert sub.get("maximum") == allowed.highest, field.name


# -- what a parser reads -----------------------------------------------------------------------
class Recorder(dict):
    """A JSON object that records the path of every member read from it."""

    def __init__(self, data: dict, path: str, reads: set[str]):
        super().__init__(data)
        self._path, self._reads = path, reads

    def _read(self, key):
        path = f"{self._path}.{key}" if self._path else str(key)
        self._reads.add(path)
        return path

    def get(self, key, default=None):
        return wrap(super().get(key, default), self._read(key), self._reads)

    def __getitem__(self, key):
        return wrap(super().__getitem__(key), self._read(key), self._reads)

    def __contains__(self, key):
        self._read(key)
        return super().__contains__(key)


def wrap(value, path: str, reads: set[str]):
    if isinstance(value, dict) and not isinstance(value, Recorder):
        return Recorder(value, path, reads)
    if isinstance(value, list):
        return [wrap(item, path + "[]", reads) for item in value]
    return value


def reads_of(parse, body: dict) -> set[str]:
    reads: set[str] = set()
    parse(Recorder(copy.deepcopy(body), "", reads))
    return reads


def declared(schema: dict, path: str = "") -> dict[str, dict]:
    """Every member path a schema declares, with its schema; free-form objects (JSON Schemas,
    tool arguments) are leaves."""
    found = {}
    for member in schema.get("anyOf", ()):
        found.update(declared(member, path))
    if "items" in schema:
        found.update(declared(schema["items"], path + "[]"))
    for key, sub in schema.get("properties", {}).items():
        inner = f"{path}.{key}" if path else key
        found[inner] = sub
        found.update(declared(sub, inner))
    return found


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_parser_reads_exactly_the_declared_fields(dialect):
    schema, parse, samples, _ = DIALECTS[dialect]
    reads = set().union(*(reads_of(parse, body) for body in samples))
    fields = declared(schema)
    undeclared = sorted(reads - set(fields))
    assert not undeclared, f"{dialect}: the parser reads fields the document does not declare: {undeclared}"
    ignored = {path for path, sub in fields.items() if sub.get("x-lmserve-ignored")}
    assert not (ignored & reads), f"{dialect}: fields marked ignored are read: {sorted(ignored & reads)}"
    unread = sorted(set(fields) - reads - ignored)
    assert not unread, f"{dialect}: declared fields the parser never reads: {unread}"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_samples_and_minimal_bodies_are_valid_by_the_schema(dialect):
    schema, parse, samples, minimal = DIALECTS[dialect]
    Draft202012Validator.check_schema(schema)
    validator = Draft202012Validator(schema)
    assert not isinstance(parse(minimal), ApiError)
    assert not isinstance(parse(samples[0]), ApiError), "the fullest sample parses"
    for body in [minimal, *samples[:1]]:
        errors = [e.message for e in validator.iter_errors(body)]
        assert not errors, f"{dialect}: a body the parser accepts is invalid by the schema: {errors}"


# -- types, bounds and enums -------------------------------------------------------------------
WRONG_TYPE = {"string": 12345, "integer": "7", "number": "0.5", "boolean": "yes", "array": "x", "object": "x"}


def outside_values(sub: dict) -> list:
    """Values a field's declaration excludes (beyond null)."""
    kinds = sub.get("type")
    kind = kinds[0] if isinstance(kinds, list) else kinds
    values = [WRONG_TYPE[kind]] if kind in WRONG_TYPE else []
    if kind == "null":  # a refused field: any value at all is refused
        values.append("x")
    if kind == "integer":
        values.append(1.5)
    if "minimum" in sub:
        values.append(sub["minimum"] - (1 if kind == "integer" else 0.01))
    if "exclusiveMinimum" in sub:
        values.append(sub["exclusiveMinimum"])
    if "maximum" in sub:
        values.append(sub["maximum"] + (1 if kind == "integer" else 0.01))
    if "enum" in sub:
        values.append("not-one-of-them")
    return values


def boundary_values(sub: dict) -> list:
    return [sub[k] for k in ("minimum", "maximum") if k in sub] + [
        v for v in sub.get("enum", []) if v is not None
    ]


def top_level(dialect: str, with_refused: bool):
    schema = DIALECTS[dialect][0]
    for name, sub in schema["properties"].items():
        if sub.get("x-lmserve-refused") and not with_refused:
            continue  # their boundary (the neutral value) is checked with the other values
        if not sub.get("x-lmserve-ignored") and "anyOf" not in sub:
            yield name, sub


def needs(schema: dict, name: str) -> dict:
    """The fields a field's declaration says its values need beside them (x-lmserve-needs)."""
    return schema["properties"][name].get("x-lmserve-needs", {})


def field_cases(outside: bool) -> list:
    cases = []
    for dialect in DIALECTS:
        for name, sub in top_level(dialect, with_refused=outside):
            values = outside_values(sub) if outside else boundary_values(sub)
            for value in values:
                cases.append(pytest.param(dialect, name, value, id=f"{dialect}-{name}-{value!r}"))
    return cases


@pytest.mark.parametrize(("dialect", "name", "value"), field_cases(outside=True))
def test_a_value_outside_the_declaration_is_refused_naming_the_field(dialect, name, value):
    schema, parse, _, minimal = DIALECTS[dialect]
    result = parse({**minimal, **needs(schema, name), name: value})
    assert isinstance(result, ApiError) and result.status == 400, f"{name}={value!r} was accepted"
    assert (result.param or "").startswith(name), (
        f"{name}={value!r} refused as {result.param}: {result.message}"
    )


@pytest.mark.parametrize(("dialect", "name", "value"), field_cases(outside=False))
def test_a_boundary_value_is_accepted(dialect, name, value):
    schema, parse, _, minimal = DIALECTS[dialect]
    result = parse({**minimal, **needs(schema, name), name: value})
    if isinstance(result, ApiError):
        assert not (result.param or "").startswith(name), f"{name}={value!r} refused: {result.message}"


def test_the_document_lists_every_endpoint_and_resolves():
    from api.metrics import _route_template
    from api.routing import api_urlpatterns

    document = build_document()
    assert document["openapi"].startswith("3.1")
    routes = {
        _route_template(p.pattern.regex.pattern).replace("{model}", "{model_id}") for p in api_urlpatterns
    }
    unprefixed = {path.removeprefix("/v1") for path in document["paths"]}
    assert {path.removeprefix("/v1") for path in routes} == unprefixed, (
        "every routed endpoint, and only those"
    )
    Draft202012Validator.check_schema({"$defs": document["components"]["schemas"]})
    for path, item in document["paths"].items():
        for operation in item.values():
            for response in operation["responses"].values():
                for media in response["content"].values():
                    ref = media["schema"].get("$ref")
                    if ref:
                        assert ref.rsplit("/", 1)[1] in document["components"]["schemas"], (path, ref)


def test_generation_replies_declare_the_fleet_documents_header():
    from api.consumers.generation import DOCUMENTS_HEADER

    paths = build_document()["paths"]
    for path in ("/v1/chat/completions", "/v1/completions", "/infill", "/v1/responses", "/v1/messages"):
        headers = paths[path]["post"]["responses"]["200"]["headers"]
        assert DOCUMENTS_HEADER.decode() in headers, path
        assert headers[DOCUMENTS_HEADER.decode()]["schema"] == {"type": "string"}
