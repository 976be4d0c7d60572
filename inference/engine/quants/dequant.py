"""Dequantize selected rows of a GroupLayout to float32 (embedding lookup, full dequantization).

The numba kernel must reproduce ``layout.dequantize_reference`` bit for bit, so it is compiled
without fastmath: no fused multiply-add may merge ``q * scale`` and ``+ min``.
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from .layout import GroupArrays
from .nibbles import NibbleLayout

# Fewer rows than this are gathered by one thread: a decode step's one embedding row through
# the parallel kernel woke the whole OpenMP team for it (~80 us of SmolLM2's ~5 ms step, idle
# threads sleeping under OMP_WAIT_POLICY=PASSIVE), for microseconds of work.
PARALLEL_ROWS = 8


def gather_kernel(group_shift: int, has_mins: bool, parallel: bool = True):
    """The row-gather kernel for groups of ``1 << group_shift`` weights (numba caches each
    variant); ``parallel``: rows shared out over the threads, else all on the caller's."""
    return _gather_kernel(group_shift, has_mins, parallel)


@functools.cache  # one dispatcher per variant however the arguments are spelled
def _gather_kernel(group_shift: int, has_mins: bool, parallel: bool):

    def gather(q, scales, mins, row_ids, out):
        cols = q.shape[1]
        for i in numba.prange(row_ids.shape[0]):
            r = row_ids[i]
            for j in range(cols):
                value = np.float32(q[r, j]) * scales[r, j >> group_shift]
                if has_mins:
                    value += mins[r, j >> group_shift]
                out[i, j] = value

    # numba's cache keys a closure by its name, code and captured values, not by its compile
    # options: a name of its own keeps the serial and the parallel build apart on disk.
    gather.__qualname__ += "_parallel" if parallel else "_serial"
    return numba.njit(parallel=parallel, cache=True)(gather)


def dequantize_rows(layout: GroupArrays, row_ids: np.ndarray) -> np.ndarray:
    """Rows ``row_ids`` (k,) of the layout -> (k, cols) float32, equal to ``layout.dequantize_reference``."""
    rows, cols = layout.shape
    ids = np.ascontiguousarray(row_ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < -rows or ids.max() >= rows):
        raise IndexError(f"row id out of range for a matrix of {rows} rows")
    ids = np.where(ids < 0, ids + rows, ids)
    if isinstance(layout, NibbleLayout):  # unpack the rows asked for, not the whole matrix
        layout, ids = layout.subset(ids), np.arange(ids.size)
    out = np.empty((ids.size, cols), np.float32)  # (k, cols)
    kernel = gather_kernel(layout.group_shift, layout.has_mins, ids.size >= PARALLEL_ROWS)
    kernel(*layout.kernel_arrays, ids, out)
    return out
