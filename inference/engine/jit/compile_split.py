"""Compiling kernels on both cores: part of a cold start's list in a second process.

numba compiles on one thread. On a cold start, ``start`` runs ``python -m
inference.engine.jit.compile_child`` on the fused forward's caller and its argument types: it
finds the callees as this process does (stage_calls.discover, by typing) and compiles those of
stage_calls.ELSEWHERE, while this process compiles the others (``compile_all``). The second
process writes what it compiles into numba's on-disk cache (it inherits NUMBA_CACHE_DIR and its
base: the same keyed directory), and this process then loads them from there. Work is split by
function, never one function's signatures across both processes: two processes never write
one kernel's cache index. (Small helpers both halves call may be compiled and saved by both:
the same code under the same name, whichever index write lands last.)

If the second process cannot start, fails or times out, this process compiles its part too,
and says so on the log: slower, never wrong. LMSERVE_COMPILE_SPLIT=0 compiles in one process.
This module is the first process's side (stage_calls calls it); compile_child.py is the
second's (it calls stage_calls), so neither imports the other's importer.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[3]  # holds the `inference` package
CHILD_TIMEOUT = 900.0  # seconds: a loaded machine compiles several times slower than an idle one
SPLIT_VARIABLE = "LMSERVE_COMPILE_SPLIT"  # "0": compile everything in this process


def compile_all(here: list, elsewhere: list, helper: subprocess.Popen | None) -> bool:
    """Compile (or load from numba's cache) every Callee of ``here`` in this process while the
    second process ``helper`` (start()) compiles those of ``elsewhere``, then load those here
    (or compile them, if it failed). Returns whether the second process did its part."""
    started = time.perf_counter()
    for callee in here:
        callee.function.compile(callee.argtypes)
    helped = False
    if helper is not None:
        own = time.perf_counter() - started
        helped = _finished(helper)
        waited = time.perf_counter() - started - own
        log.info("this process compiled its part in %.1f s, then waited %.1f s for the second", own, waited)
    for callee in elsewhere:
        callee.function.compile(callee.argtypes)  # from the cache if the second process made it
    return helped


def start(caller, signature: tuple, command: list[str] | None = None) -> subprocess.Popen | None:
    """The second process, started on ``caller`` (a numba dispatcher) for ``signature``: it
    finds the callees as this one does (stage_calls.discover) and compiles those of
    stage_calls.ELSEWHERE. None if it cannot start or LMSERVE_COMPILE_SPLIT is 0. ``command``
    replaces its command line (tests)."""
    if os.environ.get(SPLIT_VARIABLE) == "0" or caller.py_func.__module__ == "__main__":
        return None  # (a script's own kernel: the second process could not import it)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    argv = command or [sys.executable, "-m", "inference.engine.jit.compile_child"]
    errors, report = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # not pipes: a full one stalls
    try:
        child = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=report, stderr=errors, env=env, cwd=PROJECT_ROOT
        )
    except OSError as error:
        errors.close()
        report.close()
        log.warning("compiling in one process: the second could not start (%s)", error)
        return None
    child.errors, child.report = errors, report
    function = caller.py_func
    try:
        child.stdin.write(pickle.dumps((function.__module__, function.__qualname__, signature)))
        child.stdin.close()
    except OSError:
        pass  # it died at once: _finished reports its exit
    log.info("compiling the engine's kernels in two processes (the second: pid %d)", child.pid)
    return child


def found(child: subprocess.Popen) -> tuple | None:
    """What the second process's typing found (stage_calls.typed_report), once it has exited
    0; None if it wrote nothing readable."""
    child.report.seek(0)
    try:
        return pickle.loads(child.report.read()) if child.returncode == 0 else None
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError):
        return None
    finally:
        child.report.close()


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
