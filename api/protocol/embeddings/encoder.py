"""OpenAI Embeddings: the response object."""

from __future__ import annotations

import base64

import numpy as np

from inference.types import Embeddings


def encode_vector(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """A vector as OpenAI sends it: a list of floats, or base64 of little-endian float32."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, "<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector]


class EmbeddingsEncoder:
    """Builds the ``list`` object for one model."""

    def __init__(self, model: str):
        self.model = model

    def response(self, result: Embeddings, encoding_format: str) -> dict:
        data = [
            {"object": "embedding", "index": index, "embedding": encode_vector(vector, encoding_format)}
            for index, vector in enumerate(result.vectors)
        ]
        usage = {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}
        return {"object": "list", "data": data, "model": self.model, "usage": usage}
