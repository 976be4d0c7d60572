"""Qwen3.5 served live: the synthetic MoE file (tests/fixtures/synthetic_qwen35.py) behind
``manage.py lmserve``, read through the openai SDK: /health and /v1/models name its features
(no KV reuse), a reply with reasoning on streams the prompt-opened think block as
reasoning_content, a reply with reasoning off is the engine's greedy continuation of the empty
think block, and a second turn is prefilled from scratch (cached_tokens 0)."""

from __future__ import annotations

import httpx
import pytest

from inference.engine.engine import Engine
from tests.api.conftest import API_KEY, chat_stream_text, start_lmserve
from tests.fixtures.generation import greedy_text
from tests.fixtures.synthetic_qwen35 import qwen35_path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
MESSAGES = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is the capital of France?"},
]
MAX_TOKENS = 8
FEATURES = dict(
    tools=True, reasoning=True, grammar=True, kv_reuse=False, batch=False, spec=False, embeddings=True
)


@pytest.fixture(scope="module")
def model_path(synthetic_dir):
    return qwen35_path("qwen35moe", synthetic_dir)


@pytest.fixture(scope="module")
def model_server(model_path, tmp_path_factory):
    server = start_lmserve(
        tmp_path_factory.mktemp("qwen35"), str(model_path), "--api-key", API_KEY, "--ctx", "256"
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def engine(model_path) -> Engine:
    return Engine.load(model_path)


def greedy(engine: Engine, messages: list[dict], thinking: bool) -> tuple[int, str]:
    """The engine's greedy reply in this process: prompt length and the reply text."""
    prompt = engine.encode_chat(messages, enable_thinking=thinking)
    return len(prompt), greedy_text(engine, prompt, MAX_TOKENS)[1]


def test_health_and_models_name_the_features(model_server):
    health = model_server.health()
    assert health["status"] == "ok" and health["kv_reuse"] is False
    assert {k: health["capabilities"][k] for k in FEATURES} == FEATURES
    assert health["capabilities"]["kv_slots"] == 0
    headers = {"Authorization": f"Bearer {API_KEY}"}
    models = httpx.get(model_server.url + "/v1/models", headers=headers, timeout=10).json()
    assert models["data"][0]["capabilities"] == FEATURES


def test_reasoning_streams_the_think_block_the_prompt_opened(oai, engine):
    _, thought = greedy(engine, MESSAGES, thinking=True)
    reply = oai.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, reasoning_effort="low"
    )
    message = reply.choices[0].message
    assert message.model_extra["reasoning_content"] == thought and not message.content
    assert reply.usage.completion_tokens_details.reasoning_tokens == MAX_TOKENS
    stream = oai.chat.completions.create(
        model="m",
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        reasoning_effort="high",
        stream=True,
    )
    chunks = list(stream)
    assert (chat_stream_text(chunks, "reasoning_content"), chat_stream_text(chunks)) == (thought, "")


def test_a_second_turn_starts_from_an_empty_state(oai, engine):
    n_prompt, text = greedy(engine, MESSAGES, thinking=False)
    first = oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0)
    assert first.choices[0].message.content == text
    assert (first.usage.prompt_tokens, first.usage.prompt_tokens_details.cached_tokens) == (n_prompt, 0)
    turn = [*MESSAGES, {"role": "assistant", "content": text}, {"role": "user", "content": "And of Italy?"}]
    n_prompt, text = greedy(engine, turn, thinking=False)
    second = oai.chat.completions.create(model="m", messages=turn, max_tokens=MAX_TOKENS, temperature=0)
    assert second.choices[0].message.content == text
    assert (second.usage.prompt_tokens, second.usage.prompt_tokens_details.cached_tokens) == (n_prompt, 0)
