"""Embedding requests: tokenized and checked on the connection side, embedded on the worker.

The vectors come from :meth:`Engine.embed` over :func:`embedding_tokens`, the contract the
fleet index shares, so a query embedded here and a chunk embedded by the fleet compare.
"""

from __future__ import annotations

from inference.engine.embedding import embedding_tokens
from inference.engine.engine import Engine
from inference.types import ContextOverflow, EmbeddingRequest, Embeddings, Error, PreparedEmbedding

from .backend import Sink


def input_overflow_message(overflow: ContextOverflow, index: int) -> str:
    """OpenAI's context-overflow wording (the phrase clients match), naming the input."""
    return (
        f"This model's maximum context length is {overflow.n_ctx} tokens. However, input {index} "
        f"resulted in {overflow.prompt_tokens} tokens. Please reduce the length of the input. "
        f"Input tokens exceed the configured limit of {overflow.n_ctx} tokens (this server's --ctx)."
    )


def prepare_embedding(engine: Engine, n_ctx: int, request: EmbeddingRequest) -> PreparedEmbedding | Error:
    """Every text tokenized; a text longer than the context is a 400 naming ``input``."""
    prepared = []
    for index, text in enumerate(request.texts):
        tokens = embedding_tokens(engine.tokenizer, text)
        if len(tokens) > n_ctx:
            overflow = ContextOverflow(len(tokens), n_ctx)
            message = input_overflow_message(overflow, index)
            return Error(400, message, code="context_length_exceeded", param="input", overflow=overflow)
        prepared.append(tuple(tokens))
    return PreparedEmbedding(tuple(prepared))


def embed_all(engine: Engine, prepared: PreparedEmbedding, sink: Sink) -> None:
    """Embed every input in order and close ``sink`` with the vectors; stop early (pushing
    nothing) once the sink is cancelled."""
    vectors = []
    for tokens in prepared.tokens:
        if sink.cancelled:
            return
        vectors.append(engine.embed(tokens))
    sink.close(Embeddings(tuple(vectors), prepared.prompt_tokens))
