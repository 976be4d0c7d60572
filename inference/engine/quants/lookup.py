"""Embedding tables read in place: rows looked up from the mapped file, never repacked whole.

A table that is only ever looked up (an untied ``token_embd``, Gemma 4's
``per_layer_token_embd``) needs a handful of rows per forward. Repacking it into the int8
layout at load, as a product matrix is, costs the load time of the whole table and RAM of
1.1-1.5 bytes per weight (Qwen2.5-Coder-0.5B: 136M weights; Gemma 3n E2B's per-layer table:
2.2G). Here the file's bytes stay mapped and each lookup repacks just the rows asked for, then
dequantizes them with the same kernel as ``GroupedMatrix.take_rows``: the same bits.
"""

from __future__ import annotations

import numpy as np

from ..gguf_file import GGUFError
from .matrix import FLOAT_TYPES, dequantize_blocks, load_matrix, lookup_rows


class MappedRows:
    """A (rows, cols) table left in the mapped file; ``take_rows`` as ``QuantMatrix``'s."""

    def __init__(self, qtype, data: np.ndarray, shape: tuple[int, int], name: str = ""):
        rows, cols = (int(n) for n in shape)
        # One row through the full checks: a bad type or shape fails the load, not a lookup.
        load_matrix(qtype, data[:1], (1, cols), name)
        if data.shape[0] != rows:
            raise GGUFError(f"{name or 'table'}: {data.shape[0]} rows of data, expected {rows}")
        self.qtype, self.data, self.name = qtype, data, name
        self.rows, self.cols = rows, cols

    def take_rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (k,) dequantized -> (k, cols) float32, bitwise the repacked matrix's."""
        return lookup_rows(self.rows, ids, self._dequantize, self.name or "table")

    def _dequantize(self, rows: np.ndarray) -> np.ndarray:
        if self.qtype in FLOAT_TYPES:
            return load_matrix(self.qtype, self.data[rows], (rows.size, self.cols), self.name).dequantize()
        return dequantize_blocks(self.qtype, self.data[rows], self.cols)  # only the rows asked for
