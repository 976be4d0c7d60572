"""DiffusionGemma served live: the synthetic file (tests/fixtures/synthetic_diffusion_gemma.py)
behind ``manage.py lmserve``, read through the openai SDK: /health and /v1/models name its
features (none of the per-token ones), a streamed reply arrives as one delta per committed
block, exactly the blocks the engine's sampler commits in this process for the same seed, and
what block diffusion cannot honour (a JSON schema, stop strings, tools) is a
400 naming the parameter."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from inference.engine.diffusion_sampler import generate_blocks
from inference.engine.engine import Engine
from tests.api.conftest import API_KEY, anthropic_text, chat_stream_text, responses_stream_text, start_lmserve
from tests.fixtures.synthetic_diffusion_gemma import CANVAS, diffusion_gemma_path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
MESSAGES = [{"role": "user", "content": "Write a short poem about the sea."}]
CTX = 256
SEED = 11
MAX_TOKENS = 2 * CANVAS + 8  # two whole canvases and a part of a third
SCHEMA = {"name": "x", "schema": {"type": "object"}}
SCHEMA_PARAM = "response_format.json_schema.schema"
FUNCTION = {"name": "f", "parameters": {"type": "object"}}
FEATURES = dict(
    tools=False, reasoning=False, grammar=False, kv_reuse=False, batch=False, spec=False, embeddings=True
)


@pytest.fixture(scope="module")
def model_path(synthetic_dir):
    return diffusion_gemma_path(synthetic_dir)


@pytest.fixture(scope="module")
def model_server(model_path, tmp_path_factory):
    server = start_lmserve(
        tmp_path_factory.mktemp("diffusion"), str(model_path), "--api-key", API_KEY, "--ctx", str(CTX)
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def expected_blocks(model_path) -> list[str]:
    """The text of each block the sampler commits for MESSAGES and SEED, in this process."""
    engine = Engine.load(model_path)
    prompt = engine.encode_chat(MESSAGES)
    blocks = generate_blocks(engine.model, engine.new_cache(CTX), prompt, MAX_TOKENS, engine.stop_ids, SEED)
    return [
        b"".join(engine.tokenizer.token_bytes(t) for t in b.tokens).decode("utf-8", "replace") for b in blocks
    ]


def test_health_and_models_name_the_features(model_server):
    health = model_server.health()
    assert health["status"] == "ok" and health["kv_reuse"] is False
    assert {k: health["capabilities"][k] for k in FEATURES} == FEATURES
    headers = {"Authorization": f"Bearer {API_KEY}"}
    models = httpx.get(model_server.url + "/v1/models", headers=headers, timeout=10).json()
    assert models["data"][0]["capabilities"] == FEATURES


def test_a_stream_carries_one_delta_per_committed_block(oai, expected_blocks):
    stream = oai.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=MAX_TOKENS, seed=SEED, stream=True
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert deltas == [text for text in expected_blocks if text]
    assert len(expected_blocks) >= 2  # this prompt and seed run past the first canvas
    # A temperature (the chat page always sends one) is accepted and ignored: the schedule is the model's.
    reply = oai.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=MAX_TOKENS, seed=SEED, temperature=0.3, top_p=0.5
    )
    assert reply.choices[0].message.content == chat_stream_text(chunks)
    finish = "length" if reply.usage.completion_tokens == MAX_TOKENS else "stop"
    assert reply.choices[0].finish_reason == finish


def test_the_other_dialects_stream_the_same_blocks(oai, claude, expected_blocks):
    text = "".join(expected_blocks)
    events = list(
        oai.responses.create(
            model="m", input=MESSAGES, max_output_tokens=MAX_TOKENS, extra_body={"seed": SEED}, stream=True
        )
    )
    assert responses_stream_text(events) == text
    # Anthropic Messages has no seed: a reply of whole blocks, its stop sequences refused.
    message = claude.messages.create(model="m", messages=MESSAGES, max_tokens=CANVAS)
    assert anthropic_text(message) and 0 < message.usage.output_tokens <= CANVAS
    with pytest.raises(anthropic.BadRequestError, match="'stop_sequences'") as refused:
        claude.messages.create(model="m", messages=MESSAGES, max_tokens=8, stop_sequences=["\n"])
    assert refused.value.body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"response_format": {"type": "json_schema", "json_schema": SCHEMA}}, SCHEMA_PARAM),
        ({"stop": ["\n"]}, "stop"),
        ({"tools": [{"type": "function", "function": FUNCTION}]}, "tools"),
    ],
)
def test_what_block_diffusion_cannot_honour_is_a_400(oai, extra, param):
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=8, **extra)
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == param, caught.value.body
