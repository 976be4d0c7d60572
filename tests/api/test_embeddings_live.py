"""POST /v1/embeddings against a live server with the openai SDK as client: shapes, unit norm,
float and base64 agreeing, determinism, the vectors equal to the engine's own embedding
contract, a topic signal that holds on SmolLM2, and OpenAI-shaped errors."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest

from inference.engine.embedding import embedding_tokens
from inference.engine.engine import Engine
from tests.fixtures.model_files import default_model_path

pytestmark = pytest.mark.slow

N_EMBD = 576  # SmolLM2-135M's width
# Pairs on one topic; checked on SmolLM2: each pair's cosine (0.965-0.97) is above every
# cross-topic one (at most 0.902). Raw cosines run high (no centroid is subtracted here).
PAIRS = [
    ("The cat sat on the mat and purred.", "A kitten was sleeping on the rug, purring softly."),
    (
        "The stock market fell sharply as interest rates rose.",
        "Bond yields climbed and shares dropped on Wall Street.",
    ),
    ("How do I bake sourdough bread?", "Recipe for baking a loaf of bread with yeast."),
]


def vectors(reply) -> np.ndarray:
    assert reply.object == "list" and [d.index for d in reply.data] == list(range(len(reply.data)))
    rows = [
        np.frombuffer(base64.b64decode(d.embedding), "<f4") if isinstance(d.embedding, str) else d.embedding
        for d in reply.data
    ]  # an explicit encoding_format="base64" reaches the caller undecoded
    return np.array(rows, np.float32)  # (n, n_embd)


def test_float_and_base64_embeddings_agree_and_are_unit_vectors(client):
    texts = ["The cat sat on the mat.", "The cat sat on the mat.", "Quantum chromodynamics."]
    floats = client.embeddings.create(model="any", input=texts)
    packed = client.embeddings.create(model="any", input=texts, encoding_format="base64")
    a, b = vectors(floats), vectors(packed)
    assert a.shape == (3, N_EMBD) and np.array_equal(a, b)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(a[0], a[1]) and not np.array_equal(a[0], a[2])
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 0
    assert floats.model == client.models.list().data[0].id


def test_a_single_string_and_the_dimensions_of_the_model(client):
    reply = client.embeddings.create(model="any", input="hello", dimensions=N_EMBD)
    assert vectors(reply).shape == (1, N_EMBD)


def test_the_endpoint_serves_the_engines_embedding_contract(client):
    text = "Rivers carry sediment to the sea."
    served = vectors(client.embeddings.create(model="any", input=[text], encoding_format="base64"))[0]
    engine = Engine.load(default_model_path())
    tokens = embedding_tokens(engine.tokenizer, text)
    np.testing.assert_allclose(served, engine.embed(tokens), atol=2e-6)
    usage = client.embeddings.create(model="any", input=[text]).usage
    assert usage.prompt_tokens == len(tokens)


def test_a_text_is_closer_to_one_on_its_topic(client):
    texts = [t for pair in PAIRS for t in pair]
    v = vectors(client.embeddings.create(model="any", input=texts))
    cos = v @ v.T
    for i in range(0, len(texts), 2):
        others = [cos[i, j] for j in range(len(texts)) if j // 2 != i // 2]
        assert cos[i, i + 1] > max(others), (texts[i], cos[i])


@pytest.mark.parametrize(
    ("kwargs", "param", "words"),
    [
        ({"input": ""}, "input", "empty"),
        ({"input": []}, "input", "empty"),
        ({"input": [[1, 2, 3]]}, "input", "token ids"),
        ({"input": "a", "dimensions": 64}, "dimensions", str(N_EMBD)),
        ({"input": "word " * 1100}, "input", "maximum context length is 1024 tokens"),
    ],
)
def test_bad_requests_are_400s_in_openais_envelope(client, kwargs, param, words):
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="any", **kwargs)
    error = caught.value.body
    assert error["param"] == param and words in error["message"], error
    if "context" in words:
        assert error["code"] == "context_length_exceeded"
