"""How the engine takes memory from the operating system, so that RSS is what it uses.

A load repacks each matrix into temporary int8 layouts, copies them into the fused step's
arena and drops them. glibc serves blocks below its mmap threshold from the heap, and the
threshold grows to 32 MB as large blocks are freed, so most of those layouts (1-30 MB each)
land in the heap, where freed pages stay resident: RSS ended near layouts + arena. While a load
runs, ``loading_heap`` maps every block of 1 MB or more on its own (returned to the OS when
freed); after it, ``malloc_trim`` returns what the heap still holds free, and the threshold
stays fixed at 4 MB, below which temporaries come from the heap as glibc would serve them.

A KV cache is ``lazy_zeros``: numpy asks for 2 MB huge pages on large arrays, and a cache's
(layer, kv head) runs would then each take 2 MB at their first token (SmolLM2 at 32k context:
360 MB for one token); in 4 KB pages a context's memory grows with the tokens it holds.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import mmap
from collections.abc import Iterator

import numpy as np

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
LOAD_THRESHOLD = 1 << 20  # blocks this large or larger are mapped on their own during a load
SERVE_THRESHOLD = 4 << 20  # after a load: KV caches mapped, small temporaries from the heap


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


@contextlib.contextmanager
def loading_heap() -> Iterator[None]:
    """Inside: large blocks mapped on their own. After: free heap pages returned to the OS.
    Nothing changes where the C library is not glibc."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, LOAD_THRESHOLD)
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(M_MMAP_THRESHOLD, SERVE_THRESHOLD)
            libc.malloc_trim(0)


def lazy_zeros(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """A zero array in an anonymous mapping of its own, in small pages: its memory is taken
    page by page as it is written (module docstring)."""
    count = int(np.prod(shape))
    buffer = mmap.mmap(-1, max(count * np.dtype(dtype).itemsize, 1))
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buffer.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buffer, dtype, count=count).reshape(shape)  # (shape) zeros, writable
