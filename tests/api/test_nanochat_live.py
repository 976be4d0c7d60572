"""nanochat served live: ``manage.py lmserve --nanochat DIR`` on the synthetic checkpoint
(tests/fixtures/synthetic_nanochat.py), read through the openai and anthropic SDKs: /health and
/v1/models name its features, a reply is the model's own greedy continuation of nanochat's
chat protocol with honest usage, and what it cannot honour (a system message, function
tools, a grammar, embeddings) is a 400 naming it."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest

from inference.engine.nanochat_checkpoint import load_checkpoint
from inference.engine.tokenizer.nanochat_bpe import NanochatTokenizer
from tests.api.conftest import API_KEY, openai_client, start_lmserve
from tests.fixtures.synthetic_nanochat import (
    tokenizer_file,
    write_nanochat_checkpoint,
    write_transition_checkpoint,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
USER = "What is the capital of France?"
MAX_TOKENS = 8
FEATURES = dict(
    tools=False, reasoning=False, grammar=False, kv_reuse=False, batch=False, spec=False, embeddings=False
)


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    return write_nanochat_checkpoint(tmp_path_factory.mktemp("nanochat") / "nano-d3")


@pytest.fixture(scope="module")
def model_server(checkpoint_dir, tmp_path_factory):
    server = start_lmserve(
        tmp_path_factory.mktemp("nanochat-log"), "--nanochat", str(checkpoint_dir), "--api-key", API_KEY
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def expected(checkpoint_dir) -> tuple[list[int], list[int]]:
    """The prompt nanochat's protocol gives USER, written out by hand, and the greedy reply of
    the model in this process (argmax step by step, no terminal token met on the way)."""
    ck = load_checkpoint(checkpoint_dir)
    tok = ck.tokenizer
    s = tok.special_id
    prompt = [
        s("<|bos|>"),
        s("<|user_start|>"),
        *tok.encode(USER),
        s("<|user_end|>"),
        s("<|assistant_start|>"),
    ]
    cache = ck.model.new_cache(len(prompt) + MAX_TOKENS)
    logits, reply = ck.model.forward(cache, prompt)[-1], []
    for _ in range(MAX_TOKENS):
        token = int(np.argmax(logits))
        assert token not in (s("<|bos|>"), s("<|assistant_end|>"), s("<|python_start|>"))
        reply.append(token)
        logits = ck.model.forward(cache, [token])[-1]
    return prompt, reply


def test_health_and_models_name_the_features(model_server):
    health = model_server.health()
    assert health["status"] == "ok" and health["kv_reuse"] is False and health["model"] == "nano-d3"
    assert {k: health["capabilities"][k] for k in FEATURES} == FEATURES
    headers = {"Authorization": f"Bearer {API_KEY}"}
    models = httpx.get(model_server.url + "/v1/models", headers=headers, timeout=10).json()
    assert models["data"][0]["id"] == "nano-d3"
    assert models["data"][0]["capabilities"] == FEATURES


def test_reply_is_the_greedy_continuation_with_usage(oai, expected, checkpoint_dir):
    prompt, reply = expected
    out = oai.chat.completions.create(
        model="nano-d3",
        messages=[{"role": "user", "content": USER}],
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    tok = load_checkpoint(checkpoint_dir).tokenizer
    assert out.choices[0].message.content == tok.decode(reply).decode("utf-8", errors="replace")
    assert out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(prompt), MAX_TOKENS)


def test_streamed_reply_matches(oai, expected, checkpoint_dir):
    _, reply = expected
    stream = oai.chat.completions.create(
        model="nano-d3",
        messages=[{"role": "user", "content": USER}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    tok = load_checkpoint(checkpoint_dir).tokenizer
    assert text == tok.decode(reply).decode("utf-8", errors="replace")


def test_seeded_sampling_repeats(oai):
    def ask():
        return oai.chat.completions.create(
            model="nano-d3", messages=[{"role": "user", "content": "Hi"}], max_tokens=6, seed=7
        )

    first, second = ask(), ask()
    assert first.choices[0].message.content == second.choices[0].message.content


def test_system_message_is_refused(oai):
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(
            model="nano-d3",
            messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": USER}],
            max_tokens=4,
        )
    assert "no system role" in caught.value.message


def test_function_tools_are_refused(oai):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(
            model="nano-d3", messages=[{"role": "user", "content": USER}], tools=[tool], max_tokens=4
        )
    assert "tools" in caught.value.message


def test_grammar_is_refused(oai):
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(
            model="nano-d3",
            messages=[{"role": "user", "content": USER}],
            response_format={"type": "json_object"},
            max_tokens=4,
        )
    assert "response_format" in caught.value.message and "grammar" in caught.value.message


def test_embeddings_are_refused(oai):
    with pytest.raises(openai.BadRequestError) as caught:
        oai.embeddings.create(model="nano-d3", input="hello")
    assert "serves no embeddings" in caught.value.message


def test_anthropic_system_is_refused_and_reply_counts(claude, expected):
    import anthropic

    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model="nano-d3", system="Be brief.", messages=[{"role": "user", "content": USER}], max_tokens=4
        )
    assert "no system role" in str(caught.value)
    out = claude.messages.create(model="nano-d3", messages=[{"role": "user", "content": USER}], max_tokens=4)
    assert out.usage.output_tokens <= 4 and out.usage.input_tokens > 0
    counted = claude.messages.count_tokens(model="nano-d3", messages=[{"role": "user", "content": USER}])
    assert counted.input_tokens == out.usage.input_tokens == len(expected[0])


@pytest.fixture(scope="module")
def calculator_server(tmp_path_factory):
    """A server on a checkpoint whose greedy reply opens a python block with "2+3", closes it,
    then (after the calculator's forced output) says "!" and ends the turn."""
    tok = NanochatTokenizer(tokenizer_file())
    s = tok.special_id
    chain = [s("<|assistant_start|>"), s("<|python_start|>"), *tok.encode("2+3"), s("<|python_end|>")]
    transitions = dict(zip(chain, chain[1:], strict=False))
    transitions |= {s("<|output_end|>"): tok.encode("!")[0], tok.encode("!")[0]: s("<|assistant_end|>")}
    directory = write_transition_checkpoint(tmp_path_factory.mktemp("nanochat-calc") / "calc", transitions)
    server = start_lmserve(tmp_path_factory.mktemp("nanochat-calc-log"), "--nanochat", str(directory))
    yield server
    server.stop()


def test_the_calculator_result_is_forced_into_the_reply(calculator_server):
    """The model writes the python block; the server evaluates it and the reply carries the
    result between the output markers, as nanochat's engine streams it (the model itself would
    have said nothing there: its three answers after the block are overridden)."""
    with openai_client(calculator_server, api_key="unused") as client:
        out = client.chat.completions.create(
            model="calc", messages=[{"role": "user", "content": "What is 2+3?"}], temperature=0, max_tokens=32
        )
    reply = out.choices[0].message.content
    assert reply == "<|python_start|>2+3<|python_end|><|output_start|>5<|output_end|>!"
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens == 1 + 3 + 1 + 3 + 1  # the forced tokens count as generated


def test_responses_dialect_reply_and_instructions_refused(oai, expected, checkpoint_dir):
    _, reply = expected
    out = oai.responses.create(model="nano-d3", input=USER, max_output_tokens=MAX_TOKENS, temperature=0)
    tok = load_checkpoint(checkpoint_dir).tokenizer
    assert out.output_text == tok.decode(reply).decode("utf-8", errors="replace")
    assert out.usage.output_tokens == MAX_TOKENS
    with pytest.raises(openai.BadRequestError) as caught:
        oai.responses.create(model="nano-d3", input=USER, instructions="Be brief.", max_output_tokens=4)
    assert "no system role" in caught.value.message
