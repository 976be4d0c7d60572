"""Log probabilities on the real default model: the plain loop, a lockstep batch and a
speculative verify report the same numbers (bit for bit), and they describe the choice made.

The comparisons are of whole event lists (text, the tokens each delta reports, finish,
usage), each path on a fresh backend over one loaded engine so the slots start alike.
"""

from __future__ import annotations

import json
import logging
import re

import pytest

from inference.engine.engine import Engine
from inference.generation.backend import ConversationBackend
from inference.generation.constraints import ConstraintSpec
from inference.generation.drafts import VerifyCosts
from inference.types import GenerationRequest, LogprobsRequest, Message, SamplingOverrides, TextDelta
from tests.fixtures.model_files import default_model_path
from tests.inference.generation.test_lockstep import batched, solo

pytestmark = pytest.mark.timeout(900)

FREE = VerifyCosts((1, 16), (1.0, 1.0))  # verifying is free: every draft is verified
GREEDY = SamplingOverrides(temperature=0.0)
FRUITS = "apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango"
SPEC_LOG = re.compile(r"spec: (\d+)/(\d+) accepted")
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def ask(text: str, top: int = 5, **fields) -> GenerationRequest:
    fields = {"sampling": GREEDY, "max_tokens": 40, "logprobs": LogprobsRequest(top), **fields}
    return GenerationRequest((Message("user", text),), **fields)


REQUESTS = [
    ask(f"Repeat this list exactly: {FRUITS}."),  # copies the prompt: drafts are accepted
    ask("Name the capital city of France.", top=20, stop=("Paris",)),
    ask("Tell me a story about a dragon.", sampling=SamplingOverrides(temperature=0.9, top_p=0.95, seed=7)),
    ask("Invent a person.", constraint=ConstraintSpec("json_schema", json.dumps(PERSON), "response_format")),
]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load(default_model_path())


def fresh(engine: Engine, spec: bool = False) -> ConversationBackend:
    backend = ConversationBackend(engine, n_ctx=512, kv_slots=4, spec=spec)
    if spec:
        backend.speculator.costs = FREE
    return backend


def deltas(sink) -> list[TextDelta]:
    return [e for e in sink.events if isinstance(e, TextDelta)]


@pytest.mark.slow  # several seconds on a model: the slow tier (the fast one keeps under 5 minutes)
def test_plain_batched_and_speculative_report_the_same_logprobs(engine, caplog):
    plain = solo(fresh(engine), REQUESTS)
    lockstep = batched(fresh(engine), REQUESTS)
    with caplog.at_level(logging.INFO, logger="lmserve.speculative"):
        speculative = solo(fresh(engine, spec=True), REQUESTS)
    for want, got_batch, got_spec in zip(plain, lockstep, speculative, strict=True):
        assert got_batch.events == want.events
        assert got_spec.events == want.events
        assert sum(len(d.logprobs) for d in deltas(want)) > 0
    accepted = [int(m.group(1)) for m in SPEC_LOG.finditer(caplog.text)]
    assert accepted and accepted[0] > 10, caplog.text  # the list was copied from accepted drafts


def test_greedy_logprobs_describe_the_argmax_and_concatenate_to_the_text(engine):
    (sink,) = solo(fresh(engine), [ask("Name the capital city of France.", top=20)])
    records = [r for d in deltas(sink) for r in d.logprobs]
    assert b"".join(r.data for r in records).decode() == sink.text
    for record in records:
        assert len(record.top) == 20
        assert record.top[0].data == record.data and record.top[0].logprob == record.logprob
        assert all(a.logprob <= 0.0 for a in record.top)
        assert [a.logprob for a in record.top] == sorted((a.logprob for a in record.top), reverse=True)


def test_without_the_request_no_logprobs_are_reported(engine):
    (sink,) = solo(fresh(engine), [ask("Name the capital city of France.", logprobs=None)])
    assert sink.text and all(d.logprobs == () for d in deltas(sink))


def test_constrained_alternatives_are_only_tokens_the_grammar_allows(engine):
    (sink,) = solo(fresh(engine), [REQUESTS[3]])
    first = deltas(sink)[0].logprobs[0]
    assert first.data.startswith(b"{")
    assert first.top and all(a.data.startswith(b"{") for a in first.top), [a.data for a in first.top]
    json.loads(sink.text)
