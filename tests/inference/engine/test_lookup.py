"""Embedding tables read in place (quants/lookup.py): every lookup bitwise the repacked
matrix's, on every block format and the float formats, through the real Qwen2.5 file too."""

from __future__ import annotations

import numpy as np
import pytest

from inference.engine.gguf_file import GGUFError
from inference.engine.quants import load_matrix
from inference.engine.quants.lookup import MappedRows
from tests.inference.engine.test_quants import BLOCK_TYPES, Q, assert_bitwise_equal, random_quant_bytes

IDS = np.array([7, 3, 3, 0, -1, 11])  # repeats, a negative id, out of order


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_lookups_equal_the_repacked_matrix(qtype):
    data = random_quant_bytes(qtype, 12, 512, seed=5)
    table = MappedRows(qtype, data, (12, 512), "t")
    assert_bitwise_equal(table.take_rows(IDS), load_matrix(qtype, data, (12, 512)).take_rows(IDS))
    assert table.take_rows(np.array([], np.int64)).shape == (0, 512)


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16], ids=lambda t: t.name)
def test_float_tables_too(qtype):
    weights = np.random.default_rng(6).standard_normal((12, 64)).astype(np.float32)
    data = weights if qtype == Q.F32 else weights.astype(np.float16)
    table = MappedRows(qtype, data, (12, 64), "t")
    assert_bitwise_equal(table.take_rows(IDS), load_matrix(qtype, data, (12, 64)).take_rows(IDS))


def test_a_bad_id_or_shape_names_the_table():
    data = random_quant_bytes(Q.Q8_0, 4, 64)
    with pytest.raises(IndexError, match="token_embd"):
        MappedRows(Q.Q8_0, data, (4, 64), "token_embd").take_rows(np.array([4]))
    with pytest.raises(GGUFError, match="token_embd"):
        MappedRows(Q.Q8_0, data, (4, 96), "token_embd")  # rows of 64 weights, not 96


def test_the_qwen_embedding_stays_in_the_mapped_file():
    from inference.engine.engine import Engine

    engine = Engine.load("models/qwen2.5-coder-0.5b-instruct.gguf")
    embd = engine.model.token_embd
    assert isinstance(embd, MappedRows)  # Qwen2.5 has its own output.weight: never repacked
    t = engine.file.tensor("token_embd.weight")
    ids = np.array([0, 151935, 42, 42])
    assert_bitwise_equal(embd.take_rows(ids), load_matrix(t.type, t.data, t.shape).take_rows(ids))
