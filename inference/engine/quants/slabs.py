"""Row slabs of a product shared out to the engine's threads, BLAS kept single-threaded.

Each thread takes the next slab from a shared counter until none are left, so a thread that
is descheduled (another process holds its core) delays only the slab in its hands; OpenBLAS's
static split would make every call wait for it. The work functions release the GIL (numpy's
matmul, numba ``nogil`` kernels), so Python threads run them in parallel.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from threadpoolctl import threadpool_limits


@functools.cache
def _single_threaded_blas() -> None:
    # OpenBLAS must not start its own threads under ours: one thread per BLAS call, for the
    # whole process (the engine parallelizes every product itself).
    threadpool_limits(limits=1, user_api="blas")


@functools.cache
def _pool(size: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=size, thread_name_prefix="lmserve-slab")


def for_each_slab(
    rows: int,
    slab_rows: int,
    work: Callable[[int, int, np.ndarray | None], None],
    scratch_shape: tuple[int, int] | None,
) -> None:
    """Call ``work(first, stop, scratch)`` for every slab of ``slab_rows`` rows of 0..rows, on
    numba's thread count of threads; each thread gets its own float32 ``scratch``."""
    _single_threaded_blas()
    n_threads = max(1, numba.get_num_threads())
    starts = itertools.count(0, slab_rows)  # next() is atomic under the GIL

    def worker() -> None:
        scratch = None if scratch_shape is None else np.empty(scratch_shape, np.float32)  # (slab, cols)
        for first in starts:
            if first >= rows:
                return
            work(first, min(rows, first + slab_rows), scratch)

    if n_threads == 1 or rows <= slab_rows:
        worker()
        return
    pool = _pool(numba.config.NUMBA_NUM_THREADS)
    helpers = [pool.submit(worker) for _ in range(n_threads - 1)]
    worker()  # the calling thread works too
    for helper in helpers:
        helper.result()
