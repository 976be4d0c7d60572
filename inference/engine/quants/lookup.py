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
from .dequant import dequantize_rows
from .formats import FORMATS
from .layout import repack
from .matrix import FLOAT_TYPES, load_matrix


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
        rows, cols = self.rows, self.cols
        ids = np.asarray(ids, np.int64).reshape(-1)  # (k,)
        if ids.size and (ids.min() < -rows or ids.max() >= rows):
            raise IndexError(f"{self.name or 'table'}: row id out of range for {rows} rows")
        unique, where = np.unique(np.where(ids < 0, ids + rows, ids), return_inverse=True)
        if self.qtype in FLOAT_TYPES:
            picked = load_matrix(self.qtype, self.data[unique], (unique.size, cols), self.name)
            return picked.take_rows(where)  # (k, cols)
        layout = repack(FORMATS[self.qtype], self.data[unique], cols)  # only the rows asked for
        return dequantize_rows(layout, where)  # (k, cols)
