"""Work sharing inside one numba parallel region: atomic counters and a completion wait.

numba's ``prange`` gives one parallel region per loop, and waking the OpenMP team for each
costs microseconds spinning or tens of microseconds sleeping (OMP_WAIT_POLICY=PASSIVE). A
decode step has ~200 products, so one region per product spends more time waking threads than
multiplying. Instead, the whole step runs in ONE region: every thread walks the same list of
stages, claims work items of the current stage from a shared counter, and before the next
stage waits until all of this stage's items are *done* (not until all threads arrive). A
thread that never gets scheduled therefore cannot stall the others: whoever is running claims
the remaining items, so the schedule is correct with any number of threads, even one.

The counters are int64 arrays updated with LLVM atomics (numba has none of its own): a
sequentially consistent fetch-add to claim and to mark done, an acquire load to wait. The
release/acquire pair also orders the data: whatever a thread wrote before marking its item
done is visible to a thread that saw the count complete.
"""

from __future__ import annotations

import numba

from .intrinsics import atomic_add, atomic_load, cpu_pause, yield_cpu

# Spin this many times (each a CPU pause hint) before yielding the core on every further check:
# on a busy machine the thread we wait for may need this core to finish its item.
SPINS_BEFORE_YIELD = 2000


@numba.njit(cache=True)
def claim(claimed, stage):
    """The next unclaimed item number of ``stage`` (may be past the last item)."""
    return atomic_add(claimed, stage, 1)


# A two-ended claim packs its two counts in one counter: items taken from the front in the low
# half, from the back in the high half, so one fetch-add both takes an item and sees whether
# the two ends have met.
BACK_ONE = 1 << 32
FRONT_MASK = BACK_ONE - 1


@numba.njit(cache=True)
def claim_end(claimed, stage, n_items, back):
    """The next unclaimed item of ``stage``'s ``n_items``, from the front (0, 1, ...) or, with
    ``back``, from the back (n_items - 1, ...); ``n_items`` once the two ends have met. Two
    threads taking opposite ends each read one contiguous stretch of a matrix (whatever the
    hardware prefetcher learned stays useful), and still share it out at the item's grain.
    Never mixed with ``claim`` on the same stage."""
    old = atomic_add(claimed, stage, BACK_ONE if back else 1)
    front_taken, back_taken = old & FRONT_MASK, old >> 32
    if front_taken + back_taken >= n_items:
        return n_items
    return n_items - 1 - back_taken if back else front_taken


@numba.njit(cache=True)
def mark_done(done, stage):
    atomic_add(done, stage, 1)


@numba.njit(cache=True)
def wait_done(done, stage, n_items):
    """Return once ``n_items`` items of ``stage`` are marked done."""
    spins = 0
    while atomic_load(done, stage) < n_items:
        if spins < SPINS_BEFORE_YIELD:
            spins += 1
            cpu_pause()
        else:
            yield_cpu()
