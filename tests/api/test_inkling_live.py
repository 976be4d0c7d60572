"""Inkling served live: the scripted synthetic file (tests/fixtures/synthetic_inkling.py, whose
greedy reply is a thinking block and then a text block) behind ``manage.py lmserve``, read
through the openai SDK: /health and /v1/models name its features (no KV reuse, no
speculation), the thinking block routes to ``reasoning_content`` when asked for and the
primed text block answers at once when not, a grammar governs the reply from its first
token, and an image part is a 400 naming it."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.api.conftest import API_KEY, chat_stream_text, start_lmserve
from tests.fixtures.synthetic_inkling import ANSWER_TEXT, THINK_TEXT, inkling_path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ASK = [{"role": "user", "content": "What is the capital of France?"}]
# batch false: the numpy layers run one conversation after another, so --batch is refused.
FEATURES = dict(
    tools=False, reasoning=True, grammar=True, kv_reuse=False, batch=False, spec=False, embeddings=True
)


@pytest.fixture(scope="module")
def model_server(synthetic_dir, tmp_path_factory):
    path = inkling_path("inkling-think", synthetic_dir)
    log_dir = tmp_path_factory.mktemp("inkling")
    server = start_lmserve(log_dir, str(path), "--api-key", API_KEY, "--ctx", "256")
    yield server
    server.stop()


def test_health_and_models_name_the_features(model_server):
    health = model_server.health()
    assert health["status"] == "ok" and health["kv_reuse"] is False
    assert {k: health["capabilities"][k] for k in FEATURES} == FEATURES
    headers = {"Authorization": f"Bearer {API_KEY}"}
    models = httpx.get(model_server.url + "/v1/models", headers=headers, timeout=10).json()
    assert models["data"][0]["capabilities"] == FEATURES


def test_reasoning_routes_to_reasoning_content(oai):
    reply = oai.chat.completions.create(
        model="m", messages=ASK, max_tokens=40, temperature=0, reasoning_effort="high"
    )
    message = reply.choices[0].message
    assert (message.content, message.model_extra["reasoning_content"]) == (ANSWER_TEXT, THINK_TEXT)
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens_details.reasoning_tokens > 0
    chunks = list(
        oai.chat.completions.create(
            model="m", messages=ASK, max_tokens=40, temperature=0, reasoning_effort="low", stream=True
        )
    )
    reasoning, content = chat_stream_text(chunks, "reasoning_content"), chat_stream_text(chunks)
    assert (reasoning, content) == (THINK_TEXT, ANSWER_TEXT)


def test_responses_and_messages_route_it_too(oai, claude):
    response = oai.responses.create(
        model="m", input="Hi", max_output_tokens=40, temperature=0, reasoning={"effort": "medium"}
    )
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert (response.output[0].content[0].text, response.output_text) == (THINK_TEXT, ANSWER_TEXT)
    message = claude.messages.create(
        model="m", max_tokens=40, messages=ASK, thinking={"type": "enabled", "budget_tokens": 1024}
    )
    blocks = {block.type: block for block in message.content}
    assert (blocks["thinking"].thinking, blocks["text"].text) == (THINK_TEXT, ANSWER_TEXT)


def test_reasoning_off_answers_at_once(oai):
    reply = oai.chat.completions.create(model="m", messages=ASK, max_tokens=40)  # the family's sampling
    message = reply.choices[0].message
    assert message.content == ANSWER_TEXT and "reasoning_content" not in message.model_extra
    # The primed text block: no thinking tokens were generated at all.
    assert reply.usage.completion_tokens < 8


def test_a_repeated_conversation_starts_fresh(oai):
    first = oai.chat.completions.create(model="m", messages=ASK, max_tokens=40, temperature=0)
    again = oai.chat.completions.create(model="m", messages=ASK, max_tokens=40, temperature=0)
    assert again.choices[0].message.content == first.choices[0].message.content == ANSWER_TEXT
    assert again.usage.prompt_tokens_details.cached_tokens == 0


def test_a_grammar_governs_the_reply(oai):
    reply = oai.chat.completions.create(
        model="m",
        messages=ASK,
        max_tokens=20,
        temperature=0,
        reasoning_effort="high",
        extra_body={"regex": "Lyon|Nice"},
    )
    assert reply.choices[0].message.content in ("Lyon", "Nice")
    assert "reasoning_content" not in reply.choices[0].message.model_extra


def test_an_image_part_is_a_400_naming_it(oai):
    content = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": content}], max_tokens=4)
    assert caught.value.status_code == 400
    error = caught.value.body
    assert error["param"] == "messages[0].content[1].type" and "image input" in error["message"]


def test_the_generate_command_shows_the_blocks_and_refuses_spec(synthetic_dir):
    from tests.fixtures.synthetic_inkling import THINK_REPLY
    from tests.inference.test_commands import generate

    path = str(inkling_path("inkling-think", synthetic_dir))
    done = generate(path, "--chat", "--prompt", "Hi", "--max-tokens", "40")
    assert done.returncode == 0, done.stderr
    # The routing markers show, the structural <|end_message|> does not.
    assert done.stdout.strip() == THINK_REPLY.replace("<|end_message|>", "")
    # --spec was once accepted and silently dropped: now it is refused, named.
    refused = generate(path, "--chat", "--prompt", "Hi", "--max-tokens", "40", "--spec")
    assert refused.returncode != 0 and "--spec is not supported for the inkling family" in refused.stderr
