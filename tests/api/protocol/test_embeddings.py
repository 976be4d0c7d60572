"""OpenAI Embeddings: the request parser and the response encoder (no model)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from api.errors import ApiError
from api.protocol.embeddings import EmbeddingsEncoder, EmbeddingsRequest
from api.protocol.embeddings.request import MAX_INPUTS
from inference.types import EmbeddingRequest, Embeddings


def test_a_string_and_a_list_of_strings_are_texts():
    assert EmbeddingsRequest.parse({"input": "hi"}).texts == ("hi",)
    request = EmbeddingsRequest.parse({"input": ["a", "b"], "model": "x"})
    assert request.texts == ("a", "b") and request.encoding_format == "float"
    assert request.to_embedding() == EmbeddingRequest(("a", "b"))
    assert EmbeddingsRequest.parse({"input": "a", "encoding_format": "base64"}).encoding_format == "base64"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({}, "required"),
        ({"input": ""}, "empty string"),
        ({"input": []}, "empty array"),
        ({"input": ["a", ""]}, "input[1]"),
        ({"input": [1, 2, 3]}, "token ids"),
        ({"input": [[1, 2], [3]]}, "token ids"),
        ({"input": ["a", None]}, "input[1]"),
        ({"input": {"text": "a"}}, "string or an array"),
        ({"input": ["a"] * (MAX_INPUTS + 1)}, f"at most {MAX_INPUTS}"),
    ],
)
def test_bad_input_is_a_400_naming_input(body, words):
    error = EmbeddingsRequest.parse(body)
    assert isinstance(error, ApiError) and error.status == 400
    assert (error.param or "").startswith("input") and words in error.message


def test_an_unknown_encoding_format_is_refused_by_name():
    error = EmbeddingsRequest.parse({"input": "a", "encoding_format": "int8"})
    assert isinstance(error, ApiError) and error.param == "encoding_format"


def test_dimensions_other_than_the_models_are_refused_by_name():
    assert EmbeddingsRequest.parse({"input": "a", "dimensions": 576}).check_dimensions(576) is None
    assert EmbeddingsRequest.parse({"input": "a"}).check_dimensions(576) is None
    error = EmbeddingsRequest.parse({"input": "a", "dimensions": 256}).check_dimensions(576)
    assert error.status == 400 and error.param == "dimensions" and "576" in error.message


def test_the_response_has_openais_shape_in_both_encodings():
    vectors = (np.array([0.6, 0.8], np.float32), np.array([1.0, 0.0], np.float32))
    encoder = EmbeddingsEncoder("smol")
    floats = encoder.response(Embeddings(vectors, 7), "float")
    assert floats["object"] == "list" and floats["model"] == "smol"
    assert floats["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert [d["index"] for d in floats["data"]] == [0, 1]
    assert floats["data"][0] == {
        "object": "embedding",
        "index": 0,
        "embedding": [float(np.float32(0.6)), 0.8000000119209290],
    }
    packed = encoder.response(Embeddings(vectors, 7), "base64")["data"][1]["embedding"]
    raw = base64.b64decode(packed)
    assert raw == np.array([1.0, 0.0], "<f4").tobytes() and len(raw) == 8
