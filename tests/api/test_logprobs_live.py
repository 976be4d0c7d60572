"""Log probabilities through the real openai SDK: Chat Completions (``logprobs``,
``top_logprobs``) and Responses (``include: ["message.output_text.logprobs"]``).

Greedy replies on the default model: the chosen token is the argmax, so its logprob heads its
alternatives; the content tokens' bytes make the message; streamed and whole replies carry the
same numbers; a ``--spec --batch 2`` server reports exactly the plain server's numbers for a
lone (speculative) request and for two requests decoded in one lockstep batch.
"""

from __future__ import annotations

import math
import re

import httpx
import openai
import pytest

from tests.api.conftest import start_lmserve
from tests.api.test_batch_live import metric, queued_together

pytestmark = pytest.mark.slow  # live servers

FRANCE = [{"role": "user", "content": "Name the capital city of France."}]
FRUITS = "apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango"
COPY = [{"role": "user", "content": f"Repeat this list exactly: {FRUITS}."}]
SPEC_LOG = re.compile(r"spec: (\d+)/(\d+) accepted")
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def greedy(messages, top: int = 20, max_tokens: int = 24, **extra) -> dict:
    return {
        "model": "m",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": top,
        **extra,
    }


def entries(content) -> list[tuple]:
    """SDK logprob entries as plain tuples (token, logprob, bytes, alternatives)."""
    return [
        (c.token, c.logprob, c.bytes, [(a.token, a.logprob, a.bytes) for a in c.top_logprobs])
        for c in content
    ]


def raw_entries(reply: dict) -> list[tuple]:
    content = reply["choices"][0]["logprobs"]["content"]
    return [
        (
            c["token"],
            c["logprob"],
            c["bytes"],
            [(a["token"], a["logprob"], a["bytes"]) for a in c["top_logprobs"]],
        )
        for c in content
    ]


def test_a_greedy_reply_reports_the_argmax_and_its_tokens_make_the_message(client):
    reply = client.chat.completions.create(**greedy(FRANCE))
    choice = reply.choices[0]
    content = choice.logprobs.content
    assert content and choice.logprobs.refusal is None
    assert b"".join(bytes(c.bytes) for c in content).decode() == choice.message.content
    assert "".join(c.token for c in content) == choice.message.content  # ASCII: no lossy tokens
    for c in content:
        assert len(c.top_logprobs) == 20
        assert c.top_logprobs[0].token == c.token and c.top_logprobs[0].logprob == c.logprob
        assert c.logprob == max(a.logprob for a in c.top_logprobs)
        assert all(a.logprob <= 0 for a in c.top_logprobs)
        assert sum(math.exp(a.logprob) for a in c.top_logprobs) <= 1 + 1e-9
        assert bytes(c.bytes).decode() == c.token


def test_streamed_and_whole_replies_carry_the_same_numbers(client):
    whole = client.chat.completions.create(**greedy(FRANCE, top=3))
    chunks = list(client.chat.completions.create(**greedy(FRANCE, top=3), stream=True))
    streamed = [
        c for chunk in chunks for choice in chunk.choices if choice.logprobs for c in choice.logprobs.content
    ]
    assert entries(streamed) == entries(whole.choices[0].logprobs.content)
    # Each content chunk carries the tokens of its own text.
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.delta.content:
                text = b"".join(bytes(c.bytes) for c in choice.logprobs.content).decode()
                assert text == choice.delta.content


def test_no_logprobs_unless_asked_and_zero_alternatives(client):
    plain = client.chat.completions.create(model="m", messages=FRANCE, max_tokens=4, temperature=0)
    assert plain.choices[0].logprobs is None
    bare = client.chat.completions.create(**greedy(FRANCE, top=0, max_tokens=4))
    assert bare.choices[0].logprobs.content and all(
        c.top_logprobs == [] for c in bare.choices[0].logprobs.content
    )


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs")],
)
def test_bad_requests_name_the_field(client, fields, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=FRANCE, max_tokens=4, **fields)
    assert err.value.status_code == 400 and err.value.param == param


def test_a_json_schema_reply_reports_only_tokens_the_grammar_allows(client):
    schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    reply = client.chat.completions.create(
        **greedy([{"role": "user", "content": "Invent a person."}], max_tokens=40, response_format=schema)
    )
    content = reply.choices[0].logprobs.content
    first = content[0]
    assert first.token.startswith("{") and first.top_logprobs
    assert all(a.token.startswith("{") for a in first.top_logprobs), [a.token for a in first.top_logprobs]
    assert all(math.isfinite(a.logprob) for c in content for a in c.top_logprobs)
    assert b"".join(bytes(c.bytes) for c in content).decode() == reply.choices[0].message.content


def test_responses_reports_the_chat_numbers_in_its_own_shape(client):
    chat = client.chat.completions.create(**greedy(FRANCE, top=5))
    ask = {
        "model": "m",
        "input": FRANCE[0]["content"],
        "max_output_tokens": 24,
        "temperature": 0,
        "top_logprobs": 5,
    }
    whole = client.responses.create(**ask, include=["message.output_text.logprobs"])
    part = whole.output[-1].content[0]
    assert [
        (c.token, c.logprob, c.bytes, [(a.token, a.logprob, a.bytes) for a in c.top_logprobs])
        for c in part.logprobs
    ] == entries(chat.choices[0].logprobs.content)
    assert whole.top_logprobs == 5
    events = list(client.responses.create(**ask, include=["message.output_text.logprobs"], stream=True))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    streamed = [
        (c.token, c.logprob, [(a.token, a.logprob) for a in c.top_logprobs])
        for e in deltas
        for c in e.logprobs
    ]
    assert streamed == [
        (c.token, c.logprob, [(a.token, a.logprob) for a in c.top_logprobs]) for c in part.logprobs
    ]
    done = next(e for e in events if e.type == "response.output_text.done")
    assert [c.logprob for c in done.logprobs] == [c.logprob for c in part.logprobs]
    # top_logprobs alone, without include, reports nothing (as OpenAI's).
    bare = client.responses.create(**ask)
    assert bare.output[-1].content[0].logprobs == []


@pytest.fixture(scope="module")
def spec_batch(tmp_path_factory):
    """A speculative server that also batches: a lone request speculates, two queued together
    decode in one lockstep batch."""
    flags = ("--spec", "--batch", "2", "--kv-slots", "4", "--queue", "4", "--ctx", "1024")
    proc = start_lmserve(tmp_path_factory.mktemp("logprobs-spec-batch"), *flags)
    yield proc
    proc.stop()


@pytest.mark.serial  # counts accepted drafts: --spec's cost gate wants a quiet machine
def test_spec_and_batch_report_exactly_the_plain_numbers(http, spec_batch):
    bodies = [greedy(COPY, top=5, max_tokens=48), greedy(FRANCE, top=5, stop=["Paris"])]
    plain = []
    for body in bodies:
        response = http.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        plain.append(raw_entries(response.json()))
    assert all(plain)
    # Alone: speculative decoding, with drafts accepted on the copied list.
    for body, want in zip(bodies, plain, strict=True):
        response = httpx.post(spec_batch.url + "/v1/chat/completions", json=body, timeout=600)
        assert raw_entries(response.json()) == want
    accepted = [int(m.group(1)) for m in SPEC_LOG.finditer(spec_batch.logs())]
    assert accepted and max(accepted) > 10, spec_batch.logs()[-2000:]
    # Together: one lockstep batch of two.
    before = metric(spec_batch, "lmserve_lockstep_streams_total")
    together = queued_together(spec_batch, bodies, width=1)  # the lone blocker speculates
    assert [raw_entries(r.json()) for r in together] == plain
    assert metric(spec_batch, "lmserve_lockstep_streams_total") - before == 2
