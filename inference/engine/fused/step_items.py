"""How a product stage of the fused forward is cut into work items (step_kernels.py).

Several token rows (a prefill chunk) reuse each weight tile from cache, so their items are
whole tiles of TILE_ROWS weight rows, several tiles an item when the token rows are few: each
item's call costs ~30 atomic reference counts and its set-up, a real share of 16 rows' work
(FEW_ROWS_WORK), while ITEMS_PER_MATRIX items a stage keep both threads busy.

One token row (a decode step) reuses nothing: an item is a stretch of the matrix streamed
once, and each costs a claim and a completion mark on counters both cores write (a cache line
crossing between them, ~0.1-0.2 us each) plus a kernel call, against ~0.6 us of streaming for
32 rows of SmolLM2's 576 columns. The two threads claim from opposite ends
(worksharing.claim_end), so a one-row stage's items are large at the ends (up to
SOLO_ITEM_ROWS) and halve toward the middle, down to TILE_ROWS: few claims while the threads
stream apart, and small items left where they meet, so neither waits long for the other's
last one. Bounds are multiples of TILE_ROWS (but the last).
"""

from __future__ import annotations

import numba
import numpy as np

TILE_ROWS = 32  # the unit of every item: a register tile's weight rows, ~18-150 KB, reused from cache
SOLO_ITEM_ROWS = 1024  # the largest item of a one-row stage
FEW_ROWS_WORK = 64  # several token rows: items of TILE_ROWS * max(1, this // rows) weight rows...
ITEMS_PER_MATRIX = 16  # ...but no fewer items than this a stage


@numba.njit(cache=True)
def _halving(units, cap, sizes):
    """sizes[:count] := items of one end's ``units`` (of TILE_ROWS rows), from the end inward:
    ``cap`` while more than twice that is left, then half of what is left; returns count."""
    count = 0
    while units > 0:
        size = min(cap, max(1, units // 2))
        sizes[count] = size
        count += 1
        units -= size
    return count


@numba.njit(cache=True)
def item_bounds(total, n_rows, share):
    """Row bounds (items + 1,) of the work items of a stage over ``total`` weight rows with
    ``n_rows`` token rows, where an item spans ``share`` matrices of ``total`` rows (the FFN's
    gate and up: 2): uniform items of whole tiles for several rows; for one, items of at most
    SOLO_ITEM_ROWS / share from each end, halving toward the middle (module docstring)."""
    units = (total + TILE_ROWS - 1) // TILE_ROWS
    if n_rows > 1:
        few = TILE_ROWS * max(1, FEW_ROWS_WORK // n_rows)
        per = min(few, share * total // ITEMS_PER_MATRIX // TILE_ROWS * TILE_ROWS) // share
        per = max(TILE_ROWS, per // TILE_ROWS * TILE_ROWS)  # whole tiles
        bounds = np.empty((total + per - 1) // per + 1, np.int64)  # (items + 1,)
        for i in range(bounds.shape[0]):
            bounds[i] = min(total, i * per)
        return bounds
    cap_rows = SOLO_ITEM_ROWS // share
    cap = max(1, cap_rows // TILE_ROWS)
    front, back = units // 2, units - units // 2
    sizes = np.empty(units + 1, np.int64)  # (front items | back items,)
    n_front = _halving(front, cap, sizes)
    n_back = _halving(back, cap, sizes[n_front:])
    bounds = np.empty(n_front + n_back + 1, np.int64)  # (items + 1,)
    bounds[0], at = 0, 0
    for i in range(n_front):  # the front end's items, largest first
        at += sizes[i]
        bounds[i + 1] = at
    for i in range(n_back):  # the back end's, smallest (nearest the middle) first
        at += sizes[n_front + n_back - 1 - i]
        bounds[n_front + 1 + i] = at
    for i in range(bounds.shape[0]):
        bounds[i] = min(total, bounds[i] * TILE_ROWS)
    return bounds
