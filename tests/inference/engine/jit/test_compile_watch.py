"""CompileWatch: progress of numba's compilation (inference/engine/jit/compile_watch.py)."""

from __future__ import annotations

import time

import numba
from numba.core import event

from inference.engine.jit.compile_watch import EVENT, CompileWatch


def _kernels():
    """A fresh pair of kernels (never cached, never compiled): outer calls inner."""

    @numba.njit
    def inner(x):
        return x + 1

    @numba.njit
    def outer(x):
        return inner(x) * 2

    return inner, outer


class _Peek(event.Listener):
    """Reads the watch's progress line when a compilation starts (the watch saw it first)."""

    def __init__(self, watch: CompileWatch):
        self.watch, self.lines = watch, []

    def on_start(self, ev) -> None:
        self.lines.append(self.watch.progress())

    def on_end(self, ev) -> None:
        pass


def test_the_watch_counts_compilations_names_the_running_one_and_reports_the_total():
    inner, outer = _kernels()
    lines: list[str] = []
    with CompileWatch(lines.append, interval=3600) as watch:
        peek = _Peek(watch)
        event.register(EVENT, peek)
        try:
            assert outer(1) == 4
        finally:
            event.unregister(EVENT, peek)
        assert watch.progress() is None  # nothing running any more
    assert watch.compiled == 2  # outer, and inner inside it
    module = __name__.rsplit(".", 1)[-1]
    assert peek.lines[0] == f"compiling kernels: 0 done in 0 s, now {module}._kernels.<locals>.outer"
    assert peek.lines[1].endswith("._kernels.<locals>.inner")  # the innermost is named
    assert lines[0] == peek.lines[0]  # reported at once, not at the first tick an hour later
    assert len(lines) == 2 and lines[1].startswith("compiled 2 kernels in ")


def test_the_watch_ticks_while_a_compilation_runs():
    lines: list[str] = []
    watch = CompileWatch(lines.append, interval=0.01)
    with watch:
        watch._started(_kernels()[1])  # a compilation that takes its time
        deadline = time.monotonic() + 10
        while len(lines) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        watch._ended()
    assert len(lines) >= 3  # the line at the start, a tick, the total
    assert all(line.startswith("compiling kernels: 0 done in ") for line in lines[:-1])
    assert all(line.endswith("._kernels.<locals>.outer") for line in lines[:-1])
    assert lines[-1].startswith("compiled 1 kernels in ")


def test_nothing_compiled_reports_nothing():
    inner, _ = _kernels()
    inner(1)  # compiled before the watch
    lines: list[str] = []
    with CompileWatch(lines.append, interval=0.01) as watch:
        assert inner(2) == 3
    assert watch.compiled == 0 and lines == []
