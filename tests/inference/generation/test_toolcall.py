"""Hermes tool calls: the streaming scanner, and the forced-call grammar driving the real
Qwen2.5-Coder model to exactly one valid call."""

from __future__ import annotations

import json

import jsonschema
import llguidance
import pytest

from inference.engine.engine import Engine
from inference.engine.families import HERMES_TOOLS, ToolConvention
from inference.engine.gguf_file import GGUFFile
from inference.engine.sampler import SamplingParams
from inference.engine.tokenizer import load_tokenizer
from inference.generation.backend import ConversationBackend
from inference.generation.constraints import SAFE_INTEGER, ConstraintCompiler, ConstraintSpec, grammar_of
from inference.generation.toolcall import (
    ToolCall,
    ToolCallScanner,
    ToolSpec,
    auto_call_grammar,
    forced_call_grammar,
    forced_call_spec,
    parse_call,
    resolve_forced_call,
)
from inference.types import GenerationRequest, Message
from tests.fixtures.generation import generator
from tests.fixtures.model_files import default_model_path, optional_model_path

pytestmark = pytest.mark.timeout(900)

WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city.",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
)
CLOCK = ToolSpec("get_time", "The time now.", {"type": "object", "properties": {}})
COUNTER = ToolSpec(
    "count",
    "Counts things.",
    {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "wide": {"type": "integer", "minimum": -(10**18), "maximum": 10**18},
        },
        "additionalProperties": False,
    },
    strict=True,
)


def scan(parts: list[str]) -> list:
    scanner = ToolCallScanner(HERMES_TOOLS)
    out = [item for part in parts for item in scanner.feed(part)] + scanner.flush()
    merged: list = []
    for item in out:  # adjacent text pieces compare as one
        if isinstance(item, str) and merged and isinstance(merged[-1], str):
            merged[-1] += item
        else:
            merged.append(item)
    return merged


def test_scanner_captures_calls_split_anywhere():
    reply = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    for size in (1, 3, 7, len(reply)):
        parts = [reply[i : i + size] for i in range(0, len(reply), size)]
        assert scan(parts) == ["Let me check.\n", ToolCall("get_weather", '{"city": "Oslo"}')]


def test_scanner_passes_malformed_calls_through_with_markers():
    bad = "<tool_call>{not json}</tool_call>"
    assert scan(["a ", bad, " b"]) == ["a " + bad + " b"]
    assert scan(['<tool_call>{"arguments": {}}</tool_call>']) == ['<tool_call>{"arguments": {}}</tool_call>']
    assert scan(["x <tool_call>{unclosed"]) == ["x <tool_call>{unclosed"]
    assert scan(["a <tool_c"]) == ["a <tool_c"]


def test_scanner_reports_each_call_as_it_closes():
    scanner = ToolCallScanner(HERMES_TOOLS)
    first = scanner.feed('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name"')
    assert first == [ToolCall("a", "{}"), "\n"]
    assert scanner.feed(': "b", "arguments": "{\\"x\\": 1}"}</tool_call>') == [ToolCall("b", '{"x": 1}')]


BARE = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
PARIS = ToolCall("get_weather", '{"city": "Paris", "unit": "c"}')


@pytest.mark.parametrize(
    "reply",
    [
        BARE,
        "  " + BARE + "\n",
        "```json\n" + BARE + "\n```",
        "```\n" + BARE + "\n```\n",
    ],
)
def test_a_reply_that_is_exactly_one_unmarked_call_is_a_call(reply):
    # Small models under tool_choice auto often drop the <tool_call> tags (llama.cpp accepts these).
    assert scan(list(reply)) == [PARIS]  # one character at a time: undecided openings are held
    assert scan([reply]) == [PARIS]


@pytest.mark.parametrize(
    "reply",
    [
        BARE + " That is the call.",
        "Call: " + BARE,
        '{"name": "Bob", "age": 3}',
        '{"name": "get_weather", "arguments": {}, "id": 1}',
        "```python\nprint(1)\n```",
        "```json\n" + BARE + "\n``` and more",
        "{not json",
    ],
)
def test_anything_else_that_looks_like_json_stays_text(reply):
    assert scan(list(reply)) == [reply]


def test_an_unmarked_call_to_a_tool_nobody_declared_stays_text():
    """Qwen2.5-Coder-0.5B under Codex CLI wrote its shell command as the tool's name; Codex
    exits 1 on a call to a tool it did not declare, and answers on text."""
    invented = '{"name": "cat notes.txt", "arguments": {"cmd": "cat notes.txt"}}'
    declared = frozenset({"get_weather", "exec_command"})
    assert ToolCallScanner(HERMES_TOOLS, declared).feed(invented) == []  # held: it may be a call
    scanner = ToolCallScanner(HERMES_TOOLS, declared)
    assert scanner.feed(invented) + scanner.flush() == [invented]
    scanner = ToolCallScanner(HERMES_TOOLS, declared)
    assert scanner.feed(BARE) + scanner.flush() == [PARIS]


def test_text_that_cannot_be_a_bare_call_streams_at_once():
    scanner = ToolCallScanner(HERMES_TOOLS)
    assert scanner.feed("Hello") == ["Hello"]
    fenced = ToolCallScanner(HERMES_TOOLS)
    assert fenced.feed("```py") == []  # undecided until the fence's language is known
    assert fenced.feed("thon\n") == ["```python\n"]


def test_parse_call_rejects_non_calls():
    assert parse_call('{"name": "f", "arguments": [1]}') is None
    assert parse_call('{"name": "", "arguments": {}}') is None
    assert parse_call('{"name": "f"}') == ToolCall("f", "{}")


def test_forced_grammar_is_valid_lark():
    grammar = llguidance.LLMatcher.grammar_from_lark(
        forced_call_grammar([WEATHER, CLOCK], True, HERMES_TOOLS)
    )
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    assert not is_error, messages
    with pytest.raises(ValueError):
        forced_call_grammar([], True, HERMES_TOOLS)


@pytest.fixture(scope="module")
def accepts():
    """``accepts(tools, name, arguments, enforce=True)``: whether the forced-call grammar of
    ``tools`` accepts exactly that one call, on the default model's vocabulary."""
    tokenizer = load_tokenizer(GGUFFile(default_model_path()).metadata)
    compiler = ConstraintCompiler(tokenizer)

    def check(tools: list[ToolSpec], name: str, arguments: str, enforce: bool = True) -> bool:
        grammar = forced_call_grammar(tools, enforce_schemas=enforce, convention=HERMES_TOOLS)
        matcher = compiler.constraint(ConstraintSpec("lark", grammar, "tool_choice")).matcher
        reply = f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'
        return matcher.consume_tokens(tokenizer.encode(reply, parse_special=False)) and matcher.is_accepting()

    return check


def test_non_strict_schemas_are_permissive(accepts):
    off_schema = '{"x": [1, -2.5, {"y": null}], "z": "w", "t": true, "e": {}}'
    assert accepts([WEATHER], "get_weather", off_schema, enforce=False)
    assert accepts([WEATHER], "get_weather", "{}", enforce=False)
    assert not accepts([WEATHER], "get_weather", "[1]", enforce=False)
    strict = ToolSpec(WEATHER.name, WEATHER.description, WEATHER.parameters, strict=True)
    assert not accepts([strict], "get_weather", off_schema, enforce=False)
    assert accepts([strict], "get_weather", '{"city": "Oslo", "unit": "c"}', enforce=False)


def test_forced_call_numbers_have_bounded_digits(accepts):
    assert accepts([COUNTER], "count", '{"n": ' + "9" * 15 + "}")
    assert accepts([COUNTER], "count", '{"n": -' + str(SAFE_INTEGER) + "}")
    assert not accepts([COUNTER], "count", '{"n": ' + "1" * 40 + "}")
    loose = [ToolSpec("f", "", None)]
    assert accepts(loose, "f", '{"n": ' + "9" * 15 + ', "m": 0.25}', enforce=False)
    for deep in ('{"n": ' + "1" * 40 + "}", '{"a": [{"b": ' + "1" * 40 + "}]}", '{"x": 0.' + "1" * 40 + "}"):
        assert not accepts(loose, "f", deep, enforce=False), deep


def test_forced_call_stated_bounds_still_decide(accepts):
    for value in ("0", "120"):
        assert accepts([COUNTER], "count", '{"age": ' + value + "}"), value
    assert not accepts([COUNTER], "count", '{"age": 121}')
    for value in (str(10**18), "-" + "9" * 18, str(SAFE_INTEGER + 1)):  # beyond the default bound
        assert accepts([COUNTER], "count", '{"wide": ' + value + "}"), value
    assert not accepts([COUNTER], "count", '{"wide": ' + str(10**18 + 1) + "}")


@pytest.fixture(scope="module")
def qwen() -> Engine:
    return Engine.load(optional_model_path("qwen2.5-coder-0.5b-instruct.gguf"))


@pytest.mark.slow  # several seconds on a model: the slow tier (the fast one keeps under 5 minutes)
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_forced_call_on_qwen_is_one_valid_call(qwen, temperature):
    tools = [WEATHER, CLOCK]
    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    prompt = qwen.encode_prompt(qwen.render_chat(messages, tools=[t.template_dict() for t in tools]))
    constraint = resolve_forced_call(forced_call_spec(tools, True), HERMES_TOOLS)
    params = SamplingParams(temperature=temperature, top_k=40, seed=5)
    run = generator(qwen).run(qwen.new_cache(1024), prompt, params, 80, constraint=constraint)
    assert run.final.reason == "stop"  # the grammar completed, within budget
    ids = run.tokens
    items = scan([qwen.tokenizer.decode(ids)])
    assert len(items) == 1 and isinstance(items[0], ToolCall)
    call = items[0]
    schema = {t.name: t.parameters for t in tools}[call.name]
    jsonschema.validate(json.loads(call.arguments), schema)


def test_forced_call_is_spelled_in_the_family_convention():
    """A forced call parsed by a dialect carries no markers; the family's convention adds them."""
    spec = forced_call_spec([WEATHER], True)
    assert spec.kind == "tool_call" and "<tool_call>" not in spec.source
    with pytest.raises(ValueError, match="convention"):
        grammar_of(spec)
    with pytest.raises(ValueError, match="function-calling convention"):
        resolve_forced_call(spec, None)
    other = ToolConvention("angle", "<call>", "</call>")
    grammar = resolve_forced_call(spec, other)
    assert grammar.kind == "lark" and json.dumps("<call>\n") in grammar.source
    assert "<tool_call>" not in grammar.source
    assert resolve_forced_call(ConstraintSpec("regex", "a+", "x"), other) == ConstraintSpec(
        "regex", "a+", "x"
    )


def test_scanner_captures_calls_in_another_convention():
    scanner = ToolCallScanner(ToolConvention("angle", "<call>", "</call>"))
    text = 'Sure. <call>{"name": "f", "arguments": {"a": 1}}</call> <tool_call>plain</tool_call>'
    items = scanner.feed(text[:20]) + scanner.feed(text[20:]) + scanner.flush()
    assert ToolCall("f", '{"a": 1}') in items
    assert "".join(item for item in items if isinstance(item, str)) == "Sure.  <tool_call>plain</tool_call>"


@pytest.fixture(scope="module")
def qwen_compiler():
    """Qwen2.5's vocabulary, where the call marker is one token of its own."""
    tokenizer = load_tokenizer(GGUFFile(optional_model_path("qwen2.5-coder-0.5b-instruct.gguf")).metadata)
    return tokenizer, ConstraintCompiler(tokenizer)


CALL = '<tool_call>\n{{"name": "{}", "arguments": {{"city": "Oslo", "unit": "c"}}}}\n</tool_call>'


@pytest.mark.parametrize(
    ("reply", "accepted"),
    [
        ("Plain prose, even about <tool and calls.", True),
        ("", True),
        ('{"name": "get_weather", "arguments": {}}', True),  # a bare call is still text to the grammar
        ("Let me look.\n" + CALL.format("get_weather"), True),
        (CALL.format("get_weather") + "\n" + CALL.format("get_time") + "\n", True),
        ("Let me look.\n" + CALL.format("launch_code"), False),  # an undeclared tool
        (CALL.format("get_weather") + " and then some words", False),
        ('<tool_call>\n{"name": "get_weather", "arguments": [1]}\n</tool_call>', False),
        # Whitespace is where a small model pads a call forever: only json.dumps' own layout
        # inside the arguments, and at most 4 characters between calls and after the last.
        ('<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>', True),
        ('<tool_call>\n{"name": "get_time", "arguments": {"zone":  "UTC"}}\n</tool_call>', False),
        ('<tool_call>\n{"name": "get_time", "arguments": {\n"zone": "UTC"}}\n</tool_call>', False),
        ('<tool_call>\n{"name": "get_time", "arguments": {"zone":"UTC"}}\n</tool_call>', False),
        (CALL.format("get_weather") + "\n" * 4, True),
        (CALL.format("get_weather") + "\n" * 5, False),
    ],
)
def test_the_auto_call_grammar_frees_text_and_binds_calls_to_declared_tools(qwen_compiler, reply, accepted):
    tokenizer, compiler = qwen_compiler
    grammar = auto_call_grammar([WEATHER, CLOCK], HERMES_TOOLS)
    matcher = compiler.constraint(ConstraintSpec("lark", grammar, "tools")).matcher
    tokens = tokenizer.encode(reply, add_bos=False, parse_special=True)
    assert (matcher.consume_tokens(tokens) and matcher.is_accepting()) == accepted


def test_a_tool_request_decodes_under_the_call_grammar_with_the_schemas_llguidance_takes(qwen):
    backend = ConversationBackend(qwen, n_ctx=1024)
    ask = (Message("user", "What's the weather in Paris?"),)
    assert backend.constraint_spec(GenerationRequest(ask)) is None
    metadata = {
        "type": "object",
        "propertyNames": {"type": "string"},
        "additionalProperties": {},
    }  # TaskCreate
    odd = ToolSpec("f", "", {"type": "object", "properties": {"metadata": metadata}})
    spec = backend.constraint_spec(GenerationRequest(ask, tools=(WEATHER, odd)))
    assert spec.kind == "lark" and spec.param == "tools"
    compiler = ConstraintCompiler(qwen.tokenizer)

    def accepted(name: str, arguments: str) -> bool:
        matcher = compiler.constraint(spec).matcher
        reply = f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'
        return (
            matcher.consume_tokens(qwen.tokenizer.encode(reply, parse_special=True))
            and matcher.is_accepting()
        )

    assert accepted("get_weather", '{"city": "Paris", "unit": "c"}')
    assert not accepted("get_weather", '{"city": "Paris"}')  # the schema is enforced: unit is required
    assert accepted("f", '{"metadata": {"a": 1}, "other": [true]}')  # its schema does not compile: any object
