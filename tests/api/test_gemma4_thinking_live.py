"""Gemma 4 thinking served live: the synthetic file crafted to think
(tests/fixtures/synthetic_gemma4_think.py, a per-layer-embedding model) behind
``manage.py lmserve``, read through the SDKs. Asking for reasoning puts ``<|think|>`` in the
system turn; the reply's thought channel comes back as reasoning, apart from the content,
in all three dialects; without reasoning the channel is primed empty and the reply is the
answer alone."""

from __future__ import annotations

import pytest

from tests.api.conftest import API_KEY, chat_stream_text, responses_stream_text, start_lmserve
from tests.fixtures.synthetic_gemma4_think import ANSWER, REASONING, gemma4_think_path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def model_server(synthetic_dir, tmp_path_factory):
    model = gemma4_think_path(synthetic_dir)
    server = start_lmserve(
        tmp_path_factory.mktemp("gemma4-think"), str(model), "--api-key", API_KEY, "--ctx", "128"
    )
    yield server
    server.stop()


def test_health_says_gemma4_reasons(model_server):
    assert model_server.health()["capabilities"]["reasoning"] is True


def test_chat_routes_the_thought_channel_to_reasoning(oai):
    reply = oai.chat.completions.create(
        model="m", messages=ASK, max_tokens=20, temperature=0, reasoning_effort="high"
    )
    message = reply.choices[0].message
    assert (message.model_extra["reasoning_content"], message.content) == (REASONING, ANSWER)
    assert reply.choices[0].finish_reason == "stop"  # <turn|> ended the turn
    assert reply.usage.completion_tokens_details.reasoning_tokens > 0
    stream = oai.chat.completions.create(
        model="m", messages=ASK, max_tokens=20, temperature=0, reasoning_effort="low", stream=True
    )
    chunks = list(stream)
    assert (chat_stream_text(chunks, "reasoning_content"), chat_stream_text(chunks)) == (REASONING, ANSWER)


def test_without_reasoning_the_reply_is_the_answer(oai):
    reply = oai.chat.completions.create(model="m", messages=ASK, max_tokens=20, temperature=0)
    message = reply.choices[0].message
    assert message.content == ANSWER and "reasoning_content" not in message.model_extra
    assert reply.usage.completion_tokens == 1  # "Paris", then <turn|>: the model did not think


def test_responses_and_messages_dialects(oai, claude):
    effort = {"effort": "medium"}
    response = oai.responses.create(
        model="m", input=ASK, max_output_tokens=20, temperature=0, reasoning=effort
    )
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert (response.output[0].content[0].text, response.output_text) == (REASONING, ANSWER)
    with oai.responses.stream(
        model="m", input=ASK, max_output_tokens=20, temperature=0, reasoning=effort
    ) as stream:
        events = list(stream)
    assert (responses_stream_text(events, "reasoning_text"), responses_stream_text(events)) == (
        REASONING,
        ANSWER,
    )
    thinking = {"type": "enabled", "budget_tokens": 1024}
    message = claude.messages.create(model="m", max_tokens=20, messages=ASK, thinking=thinking)
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert (message.content[0].thinking, message.content[1].text) == (REASONING, ANSWER)
