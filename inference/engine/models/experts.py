"""Routed expert matrices of a mixture-of-experts layer, repacked at load or borrowed.

A 3-D expert tensor (n_expert, rows, cols) becomes a sequence of per-expert matrices. With
``--experts=repack`` every expert is converted at load. With ``--experts=borrow`` the tensor
stays a view on the memory-mapped file and ``experts[e]`` converts expert e when a router
first picks it, with the same ``load_matrix`` on the same bytes, so the products (and the
logits) are bitwise those of the repacked model. A small LRU keeps the last converted experts
of each tensor: routers pick the same few experts for neighbouring tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from ..gguf_file import GGUFFile, TensorInfo
from ..load_options import ExpertMode
from ..quants import QuantMatrix, load_matrix


def _row_span(t: TensorInfo, row_range: slice | None) -> range:
    """The rows of each expert taken (all, or the gate or up half of a fused gate_up)."""
    rows = range(t.shape[1])
    return rows[row_range] if row_range is not None else rows


class BorrowedExperts(Sequence[QuantMatrix]):
    """One expert tensor left in the mapped file; each expert converted on first use."""

    def __init__(self, t: TensorInfo, rows: range, cache_size: int):
        self.tensor, self.rows = t, rows
        self.shape = (len(rows), t.shape[2])  # one expert's (rows, cols)
        self.cache_size = max(1, cache_size)
        self.cache: OrderedDict[int, QuantMatrix] = OrderedDict()
        self.conversions = 0  # experts converted so far (a cache miss each)
        self._convert(0)  # one expert now: a bad type or shape fails the load, not a request

    def __len__(self) -> int:
        return self.tensor.shape[0]

    def __getitem__(self, e):
        if isinstance(e, slice):
            return [self[i] for i in range(len(self))[e]]
        e = int(e)
        if not 0 <= e < len(self):
            raise IndexError(f"{self.tensor.name}: expert {e} of {len(self)}")
        matrix = self.cache.get(e)
        if matrix is not None:
            self.cache.move_to_end(e)
            return matrix
        return self._convert(e)

    def _convert(self, e: int) -> QuantMatrix:
        t, rows = self.tensor, self.rows
        matrix = load_matrix(t.type, t.data[e][rows.start : rows.stop], self.shape, f"{t.name}[{e}]")
        self.conversions += 1
        self.cache[e] = matrix
        if len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)
        return matrix

    @property
    def nbytes(self) -> int:
        """Memory held by the converted experts in the cache now."""
        return sum(m.nbytes for m in self.cache.values())

    @property
    def serving_bytes(self) -> int:
        """Memory this tensor takes while serving: its experts' pages of the mapped file (the
        page cache must keep them) and a full cache of converted experts."""
        mapped = self.tensor.data[:, self.rows.start : self.rows.stop].nbytes  # (n_expert, rows, row bytes)
        one = next(iter(self.cache.values())).nbytes  # every expert converts to the same size
        return mapped + self.cache_size * one


def repacked_experts(t: TensorInfo, rows: range) -> list[QuantMatrix]:
    """Every expert of t converted now, one matrix each."""
    shape = (len(rows), t.shape[2])
    return [
        load_matrix(t.type, t.data[e][rows.start : rows.stop], shape, f"{t.name}[{e}]")
        for e in range(t.shape[0])
    ]


def routed_experts(f: GGUFFile, name: str, row_range: slice | None = None) -> Sequence[QuantMatrix]:
    """The per-expert matrices of the 3-D tensor ``name`` (optionally a row range of each), as
    the file's load options say: all repacked now, or borrowed from the mapped file."""
    t = f.tensor(name)
    rows = _row_span(t, row_range)
    if f.options.experts is ExpertMode.BORROW:
        borrowed = BorrowedExperts(t, rows, f.options.expert_cache)
        f.borrowers.append(borrowed)
        return borrowed
    return repacked_experts(t, rows)
