"""Work sharing in one parallel region (worksharing.py): every item of every stage runs exactly
once, and a stage sees everything the previous one wrote, whatever the number of threads."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from inference.engine.fused.step_items import (
    FEW_ROWS_WORK,
    ITEMS_PER_MATRIX,
    SOLO_ITEM_ROWS,
    TILE_ROWS,
    item_bounds,
)
from inference.engine.jit.intrinsics import atomic_add, atomic_load
from inference.engine.jit.worksharing import claim, claim_end, mark_done, wait_done


@numba.njit(cache=True)
def _chain_worker(claimed, done, table, runs):
    # Item i of stage s needs the whole of stage s - 1: a missing wait or a lost write shows.
    n_stages, n_items = table.shape
    for s in range(n_stages):
        item = claim(claimed, s)
        while item < n_items:
            previous = 0
            if s > 0:
                for j in range(n_items):
                    previous += table[s - 1, j]
            table[s, item] = previous % 1000003 + item + 1
            atomic_add(runs, s * n_items + item, 1)
            mark_done(done, s)
            item = claim(claimed, s)
        wait_done(done, s, n_items)


@numba.njit(parallel=True, cache=True)
def _chain(n_workers, claimed, done, table, runs):
    for _worker in numba.prange(n_workers):
        _chain_worker(claimed, done, table, runs)


def _chain_reference(n_stages: int, n_items: int) -> np.ndarray:
    table = np.zeros((n_stages, n_items), np.int64)  # (stages, items)
    for s in range(n_stages):
        previous = table[s - 1].sum() if s > 0 else 0
        table[s] = previous % 1000003 + np.arange(n_items) + 1
    return table


@pytest.mark.parametrize("n_workers", [1, 2, 5])
def test_every_item_runs_once_and_stages_are_ordered(n_workers):
    # 5 workers on (at most) 2 threads: a worker that runs after the others finished finds
    # nothing to claim and every wait already satisfied, so nothing deadlocks.
    n_stages, n_items = 300, 7
    claimed, done = np.zeros(n_stages, np.int64), np.zeros(n_stages, np.int64)  # (stages,) each
    table = np.zeros((n_stages, n_items), np.int64)  # (stages, items)
    runs = np.zeros(n_stages * n_items, np.int64)  # (stages * items,)
    _chain(n_workers, claimed, done, table, runs)
    np.testing.assert_array_equal(table, _chain_reference(n_stages, n_items))
    assert (runs == 1).all()
    assert (done == n_items).all()


@numba.njit(cache=True)
def _add_and_load(counters):
    before = atomic_add(counters, 1, 5)
    return before, atomic_load(counters, 1)


def test_atomic_add_returns_the_previous_value():
    counters = np.array([0, 10, 0], np.int64)
    assert _add_and_load(counters) == (10, 15)
    assert counters.tolist() == [0, 15, 0]


@numba.njit(cache=True)
def _two_ended_worker(claimed, done, n_items, back, runs, order):
    item = claim_end(claimed, 0, n_items, back)
    while item < n_items:
        atomic_add(runs, item, 1)
        order[atomic_add(done, 1, 1)] = item if not back else -1 - item
        mark_done(done, 0)
        item = claim_end(claimed, 0, n_items, back)
    wait_done(done, 0, n_items)


@numba.njit(parallel=True, cache=True)
def _two_ended(n_workers, claimed, done, n_items, runs, order):
    for worker in numba.prange(n_workers):
        _two_ended_worker(claimed, done, n_items, worker % 2 == 1, runs, order)


@pytest.mark.parametrize("n_workers", [1, 2, 3])
@pytest.mark.parametrize("n_items", [1, 2, 7, 300])
def test_two_ended_claims_take_every_item_once_each_end_in_order(n_workers, n_items):
    claimed, done = np.zeros(1, np.int64), np.zeros(2, np.int64)  # (stage,), (stage, order slot)
    runs = np.zeros(n_items, np.int64)  # (items,)
    order = np.zeros(n_items, np.int64)  # (claims,) item, or -1 - item from the back
    _two_ended(n_workers, claimed, done, n_items, runs, order)
    assert (runs == 1).all() and done[0] == n_items
    front = [i for i in order if i >= 0]
    back = [-1 - i for i in order if i < 0]
    if n_workers <= 2:  # one worker an end: its claims in its end's order (more may interleave)
        assert front == sorted(front) and back == sorted(back, reverse=True)
    if n_workers == 1:
        assert front == list(range(n_items))


@pytest.mark.parametrize("total", [5, 32, 70, 115, 576, 960, 1536, 49152])
@pytest.mark.parametrize("n_rows", [1, 5, 16, 64])
@pytest.mark.parametrize("share", [1, 2])
def test_item_bounds_cover_the_rows_in_whole_tiles(total, n_rows, share):
    bounds = item_bounds(total, n_rows, share)
    sizes = np.diff(bounds)
    assert bounds[0] == 0 and bounds[-1] == total and (sizes > 0).all()
    assert (bounds[:-1] % TILE_ROWS == 0).all()
    if n_rows > 1:  # uniform; more tiles an item the fewer the token rows, never fewer items than needed
        assert (sizes[:-1] == sizes[0]).all()
        assert sizes.max() <= max(TILE_ROWS, FEW_ROWS_WORK // n_rows * TILE_ROWS // share)
        assert sizes[0] <= TILE_ROWS or len(sizes) >= ITEMS_PER_MATRIX
    else:
        assert sizes.max() <= max(SOLO_ITEM_ROWS // share, TILE_ROWS)
    if n_rows == 1 and total >= 4 * TILE_ROWS:  # large at the ends, small where the ends meet
        assert min(sizes[0], sizes[-1]) > sizes[len(sizes) // 2]
