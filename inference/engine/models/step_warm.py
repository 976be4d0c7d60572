"""The first bytes of a decode step's next product, fetched into L2 before the product starts.

A decode step (one token row) streams each weight matrix once, and each of its ~120 product
stages starts cold: the first rows come from memory at full latency, and the kernel's own
prefetch (step_kernels._dot_tile_one_row) only reaches ``ahead`` bytes past the row it is on,
so the first ``ahead`` bytes of every stage are waited for. Between two products a thread runs
work that reads no weights (a norm and the rounding of the next input, k/v, attention), with
the memory bus idle. ``warm_stage`` spends that time: each thread prefetches the start of its
own stream of the next product, from the front (even threads) or from the back (odd threads,
which claim a stage's items from its end, worksharing.claim_end). Only hints: no result
depends on it.
"""

from __future__ import annotations

import numba

from ..intrinsics import prefetch_l2
from ..quants.blocks import block_kind, block_offset, block_row_bytes
from .step_kernels import (
    COLS,
    FLOAT_SHIFT,
    NIB,
    PREFETCH_BYTES,
    Q_OFF,
    QUINT,
    QUINT_PREFETCH_BYTES,
    ROWS,
    SHIFT,
)

LINE = 64


@numba.njit(cache=True)
def _warm_rows(q, lin, r, backward):
    """Prefetch into L2 the bytes the one-row kernel reads of ``lin`` before its own prefetch
    takes over: ``ahead`` bytes from row r on (downward, ending with row r, if ``backward``)."""
    if lin[ROWS] == 0 or lin[SHIFT] == FLOAT_SHIFT:
        return
    cols, quint = lin[COLS], lin[QUINT] >= 0
    own_bytes = cols if lin[NIB] < 0 else cols >> 1
    row_bytes = block_row_bytes(block_kind(lin[QUINT]), cols) if quint else own_bytes
    first = block_offset(lin[QUINT]) if quint else lin[Q_OFF]
    ahead = max(1, (QUINT_PREFETCH_BYTES if quint else PREFETCH_BYTES) // row_bytes) * row_bytes
    if backward:
        hi = first + (r + 1) * row_bytes
        lo = max(first, hi - ahead - row_bytes)
    else:
        lo = first + r * row_bytes
        hi = min(first + lin[ROWS] * row_bytes, lo + ahead + row_bytes)
    for i in range(lo - lo % LINE, hi, LINE):
        prefetch_l2(q, i)


@numba.njit(cache=True)
def warm_stage(q, linears, tid, n_rows, gate_up):
    """Before a one-row product over ``linears`` (rows_stage's stacked linears, or with
    ``gate_up`` ffn_stage's gate and up): this thread's first bytes of it into L2."""
    if n_rows != 1:
        return
    back = tid % 2 == 1
    if gate_up:
        stacked = linears[1, ROWS] == 0
        n_ff = linears[0, ROWS] // 2 if stacked else linears[0, ROWS]
        r = n_ff - 1 if back else 0
        _warm_rows(q, linears[0], r, back)
        if stacked:
            _warm_rows(q, linears[0], n_ff + r, back)
        else:
            _warm_rows(q, linears[1], r, back)
        return
    n_lin = linears.shape[0]
    for j in range(n_lin):  # the first linear with rows, from the thread's end
        k = n_lin - 1 - j if back else j
        if linears[k, ROWS] > 0:
            _warm_rows(q, linears[k], linears[k, ROWS] - 1 if back else 0, back)
            return
