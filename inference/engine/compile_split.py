"""Compiling kernels on both cores: part of a cold start's list in a second process.

numba compiles on one thread. Once the fused forward's callees are known (stage_calls.py),
``compile_all`` starts ``python -m inference.engine.compile_split`` on the ones given as
``elsewhere`` while this process compiles its own; the second process writes what it compiles
into numba's on-disk cache (it inherits NUMBA_CACHE_DIR, so the same keyed directory), and this
process then loads them from there. Work is split by function, never one function's signatures
across both processes: two processes never write one kernel's cache index. (Small helpers
both halves call may be compiled and saved by both: the same code under the same name.)

If the second process cannot start, fails or times out, this process compiles its part too,
and says so on the log: slower, never wrong.
"""

from __future__ import annotations

import importlib
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # holds the `inference` package
CHILD_TIMEOUT = 900.0  # seconds: a loaded machine compiles several times slower than an idle one
SPLIT_VARIABLE = "LMSERVE_COMPILE_SPLIT"  # "0": compile everything in this process


def compile_all(here: list, elsewhere: list, command: list[str] | None = None) -> bool:
    """Compile (or load from numba's cache) every Callee of ``here`` in this process and of
    ``elsewhere`` in a second process at the same time, then load those here. ``command``
    replaces the second process's command line (tests). Returns whether the second process
    compiled its part (False: this process did)."""
    child = _start(elsewhere, command) if elsewhere and os.environ.get(SPLIT_VARIABLE) != "0" else None
    started = time.perf_counter()
    for callee in here:
        callee.function.compile(callee.argtypes)
    if child is None:
        helped = False
    else:
        own = time.perf_counter() - started
        helped = _finished(child)
        waited = time.perf_counter() - started - own
        log.info("this process compiled its part in %.1f s, then waited %.1f s for the second", own, waited)
    for callee in elsewhere:
        callee.function.compile(callee.argtypes)  # from the cache if the second process made it
    return helped


def _job(callees: list) -> bytes:
    """What the second process compiles: (module, name, argument types) of each callee."""
    return pickle.dumps(
        [(c.function.py_func.__module__, c.function.py_func.__qualname__, c.argtypes) for c in callees]
    )


def _start(callees: list, command: list[str] | None) -> subprocess.Popen | None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    argv = command or [sys.executable, "-m", "inference.engine.compile_split"]
    errors = tempfile.TemporaryFile()  # not a pipe: a full pipe would stall the child
    try:
        child = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors, env=env, cwd=PROJECT_ROOT
        )
    except OSError as error:
        errors.close()
        log.warning("compiling in one process: the second could not start (%s)", error)
        return None
    child.errors = errors
    try:
        child.stdin.write(_job(callees))
        child.stdin.close()
    except OSError:
        pass  # it died at once: _finished reports its exit
    log.info("compiling %d of the engine's kernels in a second process (pid %d)", len(callees), child.pid)
    return child


def _finished(child: subprocess.Popen) -> bool:
    """Wait for the second process; whether it compiled everything it was given."""
    try:
        child.wait(CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        log.warning("the second compiling process took over %.0f s: compiling its part here", CHILD_TIMEOUT)
        return False
    child.errors.seek(0)
    errors = child.errors.read().decode(errors="replace").strip()
    child.errors.close()
    if child.returncode != 0:
        last = errors.splitlines()[-1] if errors else "no message"
        log.warning(
            "the second compiling process failed (exit %d: %s): compiling its part here",
            child.returncode,
            last,
        )
        return False
    log.info("the second process %s", errors.splitlines()[-1] if errors else "said nothing")
    return True


def main() -> None:
    """The second process: compile the callees pickled on stdin into numba's on-disk cache."""
    started, cpu = time.perf_counter(), time.process_time()
    import inference.engine  # noqa: F401  (keys the cache directory first, as the parent's)

    job = pickle.loads(sys.stdin.buffer.read())
    for module, name, argtypes in job:
        function = getattr(importlib.import_module(module), name)
        function.compile(argtypes)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(f"compiled {len(job)} kernels in {wall:.1f} s ({cpu:.1f} s CPU)", file=sys.stderr)


if __name__ == "__main__":
    main()
