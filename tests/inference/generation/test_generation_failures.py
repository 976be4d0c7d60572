"""Requests the model cannot finish end with an error naming the cause: a grammar that lets
no token through (a 400 naming the constraint's field), and logits that are not finite (a 500
saying the model is broken). Driven through the backend on the synthetic think model, one
build of which overflows its logits after a given token."""

from __future__ import annotations

import numpy as np
import pytest

from inference.engine.engine import Engine
from inference.engine.sampler import NonFiniteLogits, Sampler, SamplingParams
from inference.generation.backend import ConversationBackend
from inference.generation.constraints import ConstraintSpec
from inference.types import Error, Finish, GenerationRequest, Message, SamplingOverrides, TextDelta
from tests.fixtures.think_gguf import ANSWER_TEXT, think_model_path
from tests.inference.generation.test_backend import RecordingSink

pytestmark = pytest.mark.timeout(600)
DEAD_END = 'start: "Hello" NOPE\nNOPE: /[^\\x00-\\U0010FFFF]/\n'  # "Hello", then nothing fits


@pytest.mark.parametrize(
    "logits",
    [[0.0, np.nan, 1.0], [0.0, np.inf, 1.0], [-np.inf, -np.inf, -np.inf]],
    ids=["nan", "inf", "all-minus-inf"],
)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_sampler_refuses_logits_that_are_not_finite(logits, temperature):
    with pytest.raises(NonFiniteLogits):
        Sampler(SamplingParams(temperature=temperature)).sample(np.array(logits, dtype=np.float32))


def test_sampler_takes_logits_some_of_which_are_minus_infinity():
    assert Sampler(SamplingParams()).sample(np.array([-np.inf, 0.5, 0.1], dtype=np.float32)) == 1


def test_sampler_refuses_a_mask_that_leaves_only_minus_infinity():
    logits, allowed = np.array([-np.inf, 0.5, 0.1], dtype=np.float32), np.array([True, False, False])
    with pytest.raises(NonFiniteLogits):
        Sampler(SamplingParams()).sample(logits, allowed=allowed)


def run(backend: ConversationBackend, max_tokens: int = 40, **fields) -> RecordingSink:
    request = GenerationRequest(
        (Message("user", "Hi"),), SamplingOverrides(temperature=0.0), max_tokens, **fields
    )
    sink = RecordingSink()
    backend.generate(request, backend.validate(request), sink)
    return sink


@pytest.fixture(scope="module")
def backend(synthetic_dir) -> ConversationBackend:
    return ConversationBackend(Engine.load(think_model_path(synthetic_dir)), 256)


def test_a_grammar_dead_end_mid_reply_is_a_400_naming_the_field(backend):
    sink = run(backend, constraint=ConstraintSpec("lark", DEAD_END, "lark"))
    *deltas, error = sink.events
    assert deltas == [TextDelta("Hello")]
    assert isinstance(error, Error) and (error.status, error.code, error.param) == (
        400,
        "constraint_dead_end",
        "lark",
    )
    assert "allows no next token after 1 generated tokens" in error.message
    assert isinstance(run(backend).events[-1], Finish)  # the worker serves on


def test_a_grammar_dead_end_at_the_first_token(backend):
    sink = run(backend, constraint=ConstraintSpec("regex", "[^\\x00-\\U0010FFFF]", "regex"))
    assert len(sink.events) == 1 and sink.events[0].code == "constraint_dead_end"
    assert "after 0 generated tokens" in sink.events[0].message


def test_non_finite_logits_end_the_reply_with_a_500_naming_them(synthetic_dir):
    broken = ConversationBackend(Engine.load(think_model_path(synthetic_dir, overflow_after="Paris")), 256)
    *deltas, error = run(broken).events
    assert "".join(d.text for d in deltas) == ANSWER_TEXT.split(" ")[0]
    assert isinstance(error, Error) and (error.status, error.code) == (500, "non_finite_logits")
    assert "logits are not finite" in error.message
    assert run(broken).events[-1] == error  # the slot was reset; the same fault again
