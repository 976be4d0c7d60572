"""Progress of numba's compilation, so a first start never sits at a silent terminal.

numba compiles a kernel the first time it is called with new argument types, unless the
on-disk cache (numba_cache.py) holds it; on an empty cache the engine's first forward compiles
some eighty kernels, a minute or more on two cores, inside one call that prints nothing.
``CompileWatch`` listens to numba's ``numba:compile`` events (a kernel loaded from the cache
raises none) and reports when the first compilation starts, then, while a compilation runs,
every few seconds: how many kernels are done, for how long, and which one is being compiled
now. The first line comes at once because a fast machine may compile everything between two
ticks, and a tick that falls between two kernels has nothing to report. ``warm_up_notice`` says before the
first forward whether it will compile or load them.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from numba.core import event

from .numba_cache import kernel_cache_dir
from .stage_calls import compiling_ahead

EVENT = "numba:compile"


class _Listener(event.Listener):
    """Forwards numba's start and end of one compilation to the watch."""

    def __init__(self, watch: CompileWatch):
        self.watch = watch

    def on_start(self, ev: event.Event) -> None:
        self.watch._started(ev.data["dispatcher"])

    def on_end(self, ev: event.Event) -> None:
        self.watch._ended()


def kernel_name(dispatcher) -> str:
    """A kernel's short name for a progress line: its module's last part and its name."""
    function = dispatcher.py_func
    return f"{function.__module__.rsplit('.', 1)[-1]}.{function.__qualname__}"


class CompileWatch:
    """A context manager: inside it, ``report`` gets a line when numba starts its first
    compilation, then every ``interval`` seconds while one runs, and one at the end if
    anything was compiled. ``compiled`` counts the
    compilations that ended (a kernel compiled for two argument types counts twice)."""

    def __init__(self, report: Callable[[str], None], interval: float = 10.0):
        self.report = report
        self.interval = interval
        self.compiled = 0
        self._running: list[str] = []  # the compilations in progress, outermost first
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = _Listener(self)
        self._thread = threading.Thread(target=self._tick, name="lmserve-compile-watch", daemon=True)
        self._t0 = 0.0
        self._first = 0.0  # when the first compilation started (0: none yet)

    def __enter__(self) -> CompileWatch:
        self._t0 = time.perf_counter()
        event.register(EVENT, self._listener)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        event.unregister(EVENT, self._listener)
        self._stop.set()
        self._thread.join()
        if self.compiled:
            self.report(f"compiled {self.compiled} kernels in {self.seconds:.0f} s")

    @property
    def seconds(self) -> float:
        """Seconds since the first compilation started (0 if none did)."""
        return time.perf_counter() - self._first if self._first else 0.0

    def progress(self) -> str | None:
        """The progress line now, or None when nothing is being compiled."""
        with self._lock:
            if not self._running:
                return None
            now, done = self._running[-1], self.compiled
        return f"compiling kernels: {done} done in {self.seconds:.0f} s, now {now}"

    def _started(self, dispatcher) -> None:
        with self._lock:
            first = not self._first
            if first:
                self._first = time.perf_counter()
            self._running.append(kernel_name(dispatcher))
        if first:
            self.report(self.progress())

    def _ended(self) -> None:
        with self._lock:
            if self._running:
                self._running.pop()
            self.compiled += 1

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            line = self.progress()
            if line is not None:
                self.report(line)


def compiles_kernels() -> bool:
    """Whether the first forward compiles: this process's cache directory holds no kernels yet,
    or a second process started ahead is compiling into it (stage_calls.start_early: it may
    have written some kernels already)."""
    directory = os.environ.get("NUMBA_CACHE_DIR") or str(kernel_cache_dir())
    return compiling_ahead() or not any(Path(directory).glob("*/*.nbi"))


def warm_up_notice() -> str:
    """One line for a server log before the first forward compiles (or loads) the kernels."""
    directory = os.environ.get("NUMBA_CACHE_DIR") or str(kernel_cache_dir())
    if not compiles_kernels():
        return f"loading the engine's compiled kernels from {directory}"
    return (
        f"compiling the engine's kernels for this CPU into {directory}: the first start on a CPU, "
        "and after an engine update, takes a minute or two (progress below); later starts load "
        "them in seconds"
    )
