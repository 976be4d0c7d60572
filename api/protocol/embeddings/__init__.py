"""OpenAI Embeddings: the request parser and the response encoder."""

from .encoder import EmbeddingsEncoder
from .request import EmbeddingsRequest

__all__ = ["EmbeddingsEncoder", "EmbeddingsRequest"]
