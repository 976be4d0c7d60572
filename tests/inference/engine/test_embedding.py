"""Engine.embed: the final-norm last hidden state, L2-normalised, on the real default model."""

from __future__ import annotations

import numpy as np
import pytest

from inference.engine import engine as engine_module
from inference.engine.embedding import EMBED_SUFFIX, embedding_tokens
from inference.engine.engine import Engine
from inference.engine.models.base import linear
from tests.fixtures.model_files import default_model_path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load(default_model_path())


def test_embedding_is_the_row_the_head_turns_into_the_logits(engine):
    """Through the output head, the un-normalised hidden state gives the forward's logits: it
    is the final-norm state before the head, not some other layer's."""
    tokens = embedding_tokens(engine.tokenizer, "The cat sat on the mat.")
    logits = engine.prefill(engine.new_cache(len(tokens)), tokens)  # (vocab,)
    hidden = engine.model.final_hidden(tokens, engine.new_cache(len(tokens)))  # (n_embd,)
    from_hidden = linear(engine.model.output, hidden[None, :])[0]  # (vocab,)
    assert int(np.argmax(from_hidden)) == int(np.argmax(logits))
    np.testing.assert_allclose(from_hidden, logits, atol=0.05 * float(np.abs(logits).max()))
    vector = engine.embed(tokens)
    assert vector.shape == (engine.config.n_embd,) and vector.dtype == np.float32
    assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5
    np.testing.assert_allclose(vector, hidden / np.linalg.norm(hidden), rtol=1e-6, atol=1e-7)


def test_embedding_is_bitwise_stable_across_runs_and_chunkings(engine, monkeypatch):
    tokens = embedding_tokens(engine.tokenizer, "A long text about rivers and the sea. " * 12)
    first = engine.embed(tokens)
    assert np.array_equal(first, engine.embed(tokens))
    monkeypatch.setattr(engine_module, "PREFILL_CHUNK", 7)
    assert np.array_equal(first, engine.embed(tokens))


def test_embedding_tokens_end_with_the_suffix_tokenized_alone(engine):
    tok = engine.tokenizer
    suffix = tok.encode(EMBED_SUFFIX, add_bos=False, parse_special=False)
    tokens = embedding_tokens(tok, "<|im_start|>hello")
    assert tokens[-len(suffix) :] == suffix
    assert tok.token_id("<|im_start|>") not in tokens  # the user's text stays plain text
