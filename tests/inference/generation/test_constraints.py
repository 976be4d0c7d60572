"""llguidance constraints on the real default vocabulary: the tokenizer bridge, masks, the
grammar cache, and constrained generation through the engine and the backend."""

from __future__ import annotations

import json
import threading

import jsonschema
import numpy as np
import pytest

from inference.engine.engine import Engine
from inference.engine.sampler import Sampler, SamplingParams
from inference.generation.backend import ConversationBackend
from inference.generation.constraints import (
    FRACTION_DIGITS,
    SAFE_INTEGER,
    ConstraintCompiler,
    ConstraintSpec,
    bound_number_digits,
)
from inference.types import Error, Finish, GenerationRequest, Message, SamplingOverrides
from tests.fixtures.generation import generator
from tests.fixtures.model_files import default_model_path
from tests.inference.generation.test_backend import RecordingSink

pytestmark = pytest.mark.timeout(600)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load(default_model_path())


@pytest.fixture(scope="module")
def compiler(engine) -> ConstraintCompiler:
    return ConstraintCompiler(engine.tokenizer)


def test_bridge_round_trips_our_tokenization(engine, compiler):
    text = 'Hello, {"a": 1} wörld'
    ids = engine.tokenizer.encode(text, parse_special=False)
    assert compiler.lltokenizer.vocab_size == engine.tokenizer.vocab_size
    assert compiler.lltokenizer.decode_bytes(ids) == text.encode()
    assert sorted(compiler.lltokenizer.eos_tokens) == sorted(engine.tokenizer.eog_ids)


def test_the_family_stop_tokens_end_a_grammar_too(engine):
    extra = engine.tokenizer.token_id("<|im_start|>")
    stops = engine.tokenizer.eog_ids | {extra}
    bridged = ConstraintCompiler(engine.tokenizer, stop_ids=stops)
    assert sorted(bridged.lltokenizer.eos_tokens) == sorted(stops)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (ConstraintSpec("regex", "(", "regex"), "unclosed group"),
        (ConstraintSpec("lark", "start: foo", "lark"), "unknown name"),
        (ConstraintSpec.json_schema({"type": "object", "properties": 3}, "schema"), "properties"),
        (ConstraintSpec.json_schema({"type": "integer", "minimum": "low"}, "schema"), "'minimum'"),
    ],
)
def test_invalid_grammars_are_explained(compiler, spec, needle):
    problem = compiler.validate(spec)
    assert problem is not None and needle in problem


def test_valid_grammars_pass(compiler):
    for spec in (
        ConstraintSpec.json_schema(PERSON, "schema"),
        ConstraintSpec("regex", r"[a-z]+", "regex"),
        ConstraintSpec("lark", 'start: "yes" | "no"', "lark"),
    ):
        assert compiler.validate(spec) is None


def test_mask_allows_exactly_the_grammar_prefixes(engine, compiler):
    constraint = compiler.constraint(ConstraintSpec("lark", 'start: "yes" | "no"', "lark"))
    allowed = constraint.allowed(engine.tokenizer.vocab_size + 7)
    assert not allowed[engine.tokenizer.vocab_size :].any()  # padding rows never
    pieces = {engine.tokenizer.token_bytes(int(i)) for i in np.flatnonzero(allowed)}
    assert pieces and all(b"yes".startswith(p) or b"no".startswith(p) for p in pieces)


def test_grammar_completion_is_reported(engine, compiler):
    constraint = compiler.constraint(ConstraintSpec("lark", 'start: "yes" | "no"', "lark"))
    ids = engine.tokenizer.encode("yes", parse_special=False)
    done = [constraint.accept(t) for t in ids]
    assert done[-1] and not any(done[:-1]) and constraint.completed


def test_base_grammars_are_cached_and_cloned(engine, compiler):
    spec = ConstraintSpec("regex", "[0-9]", "regex")
    before = compiler.cached
    first, second = compiler.constraint(spec), compiler.constraint(spec)
    assert compiler.cached == before + 1
    assert first.accept(engine.tokenizer.encode("1", parse_special=False)[0])
    assert first.completed and not second.completed  # clones advance apart


def test_cache_is_bounded_lru(engine):
    small = ConstraintCompiler(engine.tokenizer, cache_size=2)
    for n in range(4):
        small.constraint(ConstraintSpec("regex", f"a{{{n + 1}}}", "regex"))
    assert small.cached == 2


def test_cache_belongs_to_one_thread(engine):
    compiler = ConstraintCompiler(engine.tokenizer)
    compiler.constraint(ConstraintSpec("regex", "a", "regex"))
    errors = []
    worker = threading.Thread(target=lambda: _record(errors, compiler))
    worker.start()
    worker.join()
    assert errors and "worker thread" in errors[0]


def _record(errors, compiler):
    try:
        compiler.constraint(ConstraintSpec("regex", "b", "regex"))
    except RuntimeError as exc:
        errors.append(str(exc))


def test_sampler_never_picks_a_masked_token():
    logits = np.array([5.0, 4.0, 3.0, -1.0], dtype=np.float32)
    allowed = np.array([False, False, True, True])
    assert Sampler(SamplingParams()).sample(logits, allowed=allowed) == 2
    hot = Sampler(SamplingParams(temperature=1.5, top_k=3, seed=1))
    assert {hot.sample(logits, allowed=allowed) for _ in range(50)} <= {2, 3}


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_engine_generates_schema_valid_json(engine, temperature):
    prompt = engine.encode_prompt(engine.render_chat([{"role": "user", "content": "Describe a person."}]))
    constraint = ConstraintSpec.json_schema(PERSON, "schema")
    params = SamplingParams(temperature=temperature, top_k=40, seed=3)
    run = generator(engine).run(engine.new_cache(512), prompt, params, 80, constraint=constraint)
    assert run.final.reason == "stop"  # the grammar completed, within budget
    ids = run.tokens
    jsonschema.validate(json.loads(engine.tokenizer.decode(ids)), PERSON)


def test_backend_rejects_invalid_grammar_and_bounds_replies(engine):
    backend = ConversationBackend(engine, 512)
    ask = (Message("user", "Count."),)
    bad = GenerationRequest(ask, constraint=ConstraintSpec("regex", "(", "regex"))
    error = backend.validate(bad)
    assert isinstance(error, Error) and error.status == 400 and error.param == "regex"
    assert "unclosed group" in error.message
    endless = GenerationRequest(
        ask,
        SamplingOverrides(temperature=0.0),
        max_tokens=6,
        constraint=ConstraintSpec("regex", "[0-9]+", "r"),
    )
    sink = RecordingSink()
    backend.generate(endless, backend.validate(endless), sink)
    final = sink.events[-1]
    assert isinstance(final, Finish) and final.reason == "length" and final.usage.completion_tokens == 6
    assert sink.text.isdigit()


def _matches(engine, compiler, schema, text: str) -> bool:
    """Whether the compiled grammar of ``schema`` accepts exactly ``text``."""
    matcher = compiler.constraint(ConstraintSpec.json_schema(schema, "schema")).matcher
    return (
        matcher.consume_tokens(engine.tokenizer.encode(text, parse_special=False)) and matcher.is_accepting()
    )


def test_open_numbers_have_bounded_digits(engine, compiler):
    integer, number = {"type": "integer"}, {"type": "number"}
    assert _matches(engine, compiler, integer, "-" + "9" * 15)
    assert _matches(engine, compiler, integer, str(SAFE_INTEGER))
    assert not _matches(engine, compiler, integer, "1" * 40)
    assert not _matches(engine, compiler, integer, str(SAFE_INTEGER + 1))
    assert _matches(engine, compiler, number, "-12.5")
    assert _matches(engine, compiler, number, "0." + "1" * FRACTION_DIGITS)
    assert not _matches(engine, compiler, number, "0." + "1" * 40)
    assert not _matches(engine, compiler, number, "1" * 40 + ".5")
    within = {"type": "object", "properties": {"n": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}
    assert not _matches(engine, compiler, {"type": "array", "items": within}, '[{"n":' + "7" * 40 + "}]")


def test_stated_bounds_still_decide(engine, compiler):
    celsius = {"type": "number", "minimum": -50, "maximum": 60}
    for text in ("-50", "60", "10.5", "-49.25"):
        assert _matches(engine, compiler, celsius, text), text
    for text in ("61", "-50.5", "60.0000001", "10.5" + "0" * 30):
        assert not _matches(engine, compiler, celsius, text), text
    age = {"type": "integer", "minimum": 0, "maximum": 120}
    assert _matches(engine, compiler, age, "120") and not _matches(engine, compiler, age, "121")
    assert not _matches(engine, compiler, {"type": "integer", "exclusiveMinimum": 5}, "5")
    assert _matches(engine, compiler, {"enum": [10**20, 2]}, str(10**20))
    fine = {"type": "number", "minimum": 0, "maximum": 1e-12}  # finer than the fraction bound
    assert _matches(engine, compiler, fine, "0.000000000001")


def test_digit_bounds_only_add_to_open_sides():
    schema = {
        "type": "object",
        "properties": {
            "open": {"type": ["number", "null"]},
            "above": {"type": "integer", "minimum": 10**20},
            "stepped": {"type": "number", "multipleOf": 0.25, "maximum": 9},
            "picked": {"type": "integer", "enum": [10**20]},
            "excluded": {"not": {"type": "integer"}},
        },
        "$defs": {"d": {"type": "integer"}},
    }
    bounded = bound_number_digits(schema)
    assert schema["properties"]["open"] == {"type": ["number", "null"]}  # the input is not changed
    step = float(f"1e-{FRACTION_DIGITS}")
    props = bounded["properties"]
    assert props["open"] == {
        "type": ["number", "null"],
        "minimum": -SAFE_INTEGER,
        "maximum": SAFE_INTEGER,
        "multipleOf": step,
    }
    assert props["above"] == schema["properties"]["above"]  # a cap would empty the range
    assert props["stepped"] == {"type": "number", "multipleOf": 0.25, "maximum": 9, "minimum": -SAFE_INTEGER}
    assert props["picked"] == schema["properties"]["picked"]
    assert props["excluded"] == schema["properties"]["excluded"]  # bounding inside "not" loosens
    assert bounded["$defs"]["d"] == {"type": "integer", "minimum": -SAFE_INTEGER, "maximum": SAFE_INTEGER}
    tiny = {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": step}
    assert bound_number_digits(tiny) == tiny  # no multiple of the step lies strictly inside
