"""Gemma 4 served live: the synthetic MoE file (tests/fixtures/synthetic_gemma4.py) behind
``manage.py lmserve``, read through the openai SDK: /health and /v1/models name its features,
a chat reply is the engine's own greedy continuation of the Gemma 4 prompt (streamed and not),
its stop tokens end a turn, and a repeated conversation reuses the cached rows. The server
borrows the experts from the mapped file (``--experts=borrow``) while the expected reply comes
from an engine that repacked them: the two must agree token for token."""

from __future__ import annotations

import httpx
import pytest

from inference.engine.engine import Engine
from tests.api.conftest import API_KEY, chat_stream_text, start_lmserve
from tests.fixtures.generation import greedy_text
from tests.fixtures.synthetic_gemma4 import gemma4_path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
MESSAGES = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is the capital of France?"},
]
MAX_TOKENS = 12
# batch false: the numpy layers run one conversation after another, so --batch is refused.
FEATURES = dict(
    tools=False, reasoning=True, grammar=True, kv_reuse=True, batch=False, spec=True, embeddings=True
)


@pytest.fixture(scope="module")
def model_path(synthetic_dir):
    return gemma4_path("gemma4-moe", synthetic_dir)


@pytest.fixture(scope="module")
def model_server(model_path, tmp_path_factory):
    server = start_lmserve(
        tmp_path_factory.mktemp("gemma4"),
        str(model_path),
        "--api-key",
        API_KEY,
        "--ctx",
        "256",
        "--experts=borrow",
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def expected(model_path) -> tuple[list[int], str]:
    """The engine's greedy reply in this process: the token ids and the text a user sees
    (control tokens, such as the thought-channel markers this random model writes, are none)."""
    engine = Engine.load(model_path)
    prompt = engine.encode_chat(MESSAGES)
    ids, text = greedy_text(engine, prompt, MAX_TOKENS)
    assert any(engine.tokenizer.is_control(i) for i in ids)  # so hidden control tokens are covered too
    return ids, text


def test_health_and_models_name_the_features(model_server):
    health = model_server.health()
    assert health["status"] == "ok" and health["kv_reuse"] is True and health["experts"] == "borrow"
    assert {k: health["capabilities"][k] for k in FEATURES} == FEATURES
    headers = {"Authorization": f"Bearer {API_KEY}"}
    models = httpx.get(model_server.url + "/v1/models", headers=headers, timeout=10).json()
    assert models["data"][0]["capabilities"] == FEATURES


def test_reply_is_the_engines_greedy_continuation(oai, expected):
    ids, text = expected
    reply = oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0)
    assert reply.choices[0].message.content == text
    assert reply.usage.completion_tokens == len(ids)
    assert reply.choices[0].finish_reason == ("length" if len(ids) == MAX_TOKENS else "stop")
    stream = oai.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    assert chat_stream_text(list(stream)) == text


def test_a_repeated_conversation_reuses_cached_rows(oai):
    first = oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2, temperature=0)
    again = oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2, temperature=0)
    assert again.choices[0].message.content == first.choices[0].message.content
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached <= again.usage.prompt_tokens
