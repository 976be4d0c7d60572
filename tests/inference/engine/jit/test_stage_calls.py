"""Pointer calls between kernels (inference/engine/jit/stage_calls.py) and the two-process cold
compile (inference/engine/jit/compile_split.py, compile_child.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numba
import numpy as np
import pytest

from inference.engine.jit import compile_split, stage_calls
from inference.engine.jit.compile_watch import warm_up_notice
from inference.engine.jit.stage_calls import Callee, Sites
from tests.fixtures.model_files import default_model_path

ROOT = Path(__file__).resolve().parents[4]


@numba.njit
def axpy(a, b, k):
    """a += b * k; refuses a negative k (to see an exception cross a pointer call)."""
    for i in range(a.shape[0]):
        a[i] += b[i] * k
    if k < 0:
        raise ValueError("negative k")


SITES = Sites("test_stage_calls")
AXPY_AT = SITES.add(axpy)
call = SITES.call
stage_calls.compile_elsewhere(axpy)  # a second process started on twice_by_pointer compiles it


@numba.njit
def twice_by_pointer(a, b, k):
    call(AXPY_AT, (a, b, k))
    call(AXPY_AT, (a, b, k * 2))


@numba.njit
def twice_direct(a, b, k):
    axpy(a, b, k)
    axpy(a, b, k * 2)


def _vectors(dtype=np.float32):
    rng = np.random.default_rng(3)
    return rng.standard_normal(37).astype(dtype), rng.standard_normal(37).astype(dtype)


def test_a_pointer_call_gives_the_direct_calls_bits_and_passes_its_exception_up():
    a, b = _vectors()
    expected = a.copy()
    twice_direct(expected, b, np.float32(0.7))
    args = (a, b, np.float32(0.7))
    stage_calls.prepare(twice_by_pointer, args)
    twice_by_pointer(*args)
    np.testing.assert_array_equal(a, expected)
    with pytest.raises(ValueError, match="negative k"):
        twice_by_pointer(a, b, np.float32(-1.0))


def test_a_site_without_an_address_raises_instead_of_jumping_to_zero():
    # A table named anew in each process: a warm start records the persisted sites of every
    # table typed in the process that saved them (this module's tables too, when an earlier
    # run typed them before a model's forward was first prepared), so a slot of SITES may
    # be filled by another caller's prepare. Nothing ever fills this one.
    sites = Sites(f"test_stage_calls_unprepared_{os.getpid()}_{time.monotonic_ns()}")
    at, call_unprepared = sites.add(axpy), sites.call

    @numba.njit
    def unprepared(a, b, k):
        call_unprepared(at, (a, b, k))

    a, b = _vectors(np.int16)
    with pytest.raises(RuntimeError, match="axpy has no address"):
        unprepared(a, b, np.int16(1))


def test_each_argument_type_has_its_own_slot():
    a32, b32 = _vectors()
    a64, b64 = _vectors(np.float64)
    stage_calls.prepare(twice_by_pointer, (a32, b32, np.float32(1.0)))
    stage_calls.prepare(twice_by_pointer, (a64, b64, 1.0))
    slots = {slot for slot, callee in SITES.slots.items() if callee.function is axpy}
    assert len(slots) >= 2
    expected = a64.copy()
    twice_direct(expected, b64, 1.0)
    twice_by_pointer(a64, b64, 1.0)
    np.testing.assert_array_equal(a64, expected)


def test_the_second_process_finds_and_compiles_its_part(caplog):
    caplog.set_level(logging.INFO, logger=compile_split.__name__)
    a, b = _vectors(np.int32)
    signature = tuple(numba.typeof(v) for v in (a, b, np.int32(1)))
    helper = compile_split.start(twice_by_pointer, signature)
    assert helper is not None
    there = [Callee(axpy, signature)]
    assert compile_split.compile_all([], there, helper)  # it exited 0
    # axpy for (int32, int32, int32) and, k * 2 being an int64, for (int32, int32, int64): found by
    # typing the caller there
    assert "the second process compiled 2 kernels" in caplog.text


def test_if_the_second_process_fails_this_one_compiles_its_part():
    a, b = _vectors(np.int64)
    signature = tuple(numba.typeof(v) for v in (a, b, np.int64(1)))
    failing = [sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(3)"]
    helper = compile_split.start(twice_by_pointer, signature, command=failing)
    assert helper is not None
    there = [Callee(axpy, signature)]
    assert not compile_split.compile_all([], there, helper)
    assert signature in axpy.overloads  # compiled here instead


WARM_SCRIPT = """
import sys
from inference.engine.jit import stage_calls
from inference.engine.jit.compile_watch import CompileWatch
from inference.engine.engine import Engine
discoveries = []
original = stage_calls.discover
stage_calls.discover = lambda *a: (discoveries.append(a), original(*a))
engine = Engine.load(sys.argv[1])
with CompileWatch(lambda line: None) as watch:
    engine.warm_up()
print(watch.compiled, len(discoveries))
"""


def test_a_warm_start_loads_the_persisted_sites_and_compiles_nothing():
    """A fresh process on a filled cache: the sites' argument types come from the file beside
    numba's cache (no typing of the forward), every kernel from numba's cache."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    path = str(default_model_path())
    run = [sys.executable, "-c", WARM_SCRIPT, path]
    subprocess.run(run, env=env, cwd=ROOT, check=True, capture_output=True)  # fills the cache if empty
    out = subprocess.run(run, env=env, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    compiled, discoveries = (int(v) for v in out.split())
    assert (compiled, discoveries) == (0, 0)


@numba.njit
def scale_by(a, k):
    for i in range(a.shape[0]):
        a[i] *= k


NEEDS_SITES = Sites("test_stage_calls_needs")
SCALE_AT = NEEDS_SITES.add(scale_by, needs="scaling")
needs_call = NEEDS_SITES.call


@numba.njit
def scale_if(a, k, wanted):
    if wanted:
        needs_call(SCALE_AT, (a, k))


def test_a_callee_needing_a_feature_is_compiled_only_with_it():
    a = np.ones(5, np.float32)
    args = (a, np.float32(3.0), False)
    stage_calls.prepare(scale_if, args)
    callee_types = next(c.argtypes for c in NEEDS_SITES.slots.values())
    assert callee_types not in scale_by.overloads  # no model feature "scaling": never compiled
    scale_if(*args)
    with pytest.raises(RuntimeError, match="scale_by has no address"):
        scale_if(a, np.float32(3.0), True)  # reached all the same: an error, not a jump to 0
    stage_calls.prepare(scale_if, args, frozenset(["scaling"]))
    assert callee_types in scale_by.overloads
    scale_if(a, np.float32(3.0), True)
    np.testing.assert_array_equal(a, np.full(5, 3.0, np.float32))


def test_a_second_process_started_ahead_is_the_one_prepare_uses(caplog):
    caplog.set_level(logging.INFO, logger=compile_split.__name__)
    a, b = _vectors(np.uint32)
    args = (a, b, np.uint32(1))
    signature = tuple(numba.typeof(v) for v in args)
    # a cold start for these types: the per-user cache outlives test runs, and a warm one
    # (sites saved by an earlier run) rightly starts no second process
    stage_calls._sites_path(twice_by_pointer, signature).unlink(missing_ok=True)
    stage_calls.start_early(twice_by_pointer, signature)
    assert (twice_by_pointer, signature) in stage_calls._early
    stage_calls.prepare(twice_by_pointer, args)
    assert not stage_calls._early
    assert caplog.text.count("compiling the engine's kernels in two processes") == 1
    assert "the second process compiled 2 kernels" in caplog.text


def test_a_second_process_started_ahead_for_other_types_is_stopped():
    a, b = _vectors(np.uint16)
    signature = tuple(numba.typeof(v) for v in (a, b, np.uint16(1)))
    stage_calls.start_early(twice_by_pointer, signature)
    helper = stage_calls._early[(twice_by_pointer, signature)]
    # a start-up log then says kernels are being compiled, whatever the cache holds already
    assert stage_calls.compiling_ahead() and warm_up_notice().startswith("compiling the engine's kernels")
    stage_calls.cancel_early()
    assert helper.returncode is not None and not stage_calls.compiling_ahead()


SIGNATURE_SCRIPT = """
import sys
from inference.engine.jit import stage_calls
from inference.engine.engine import Engine
from inference.engine.fused import step_region
seen = []
original = stage_calls.prepare
def prepare(caller, args, *features):
    seen.append(tuple(caller.typeof_pyval(a) for a in args))
    original(caller, args, *features)
stage_calls.prepare = prepare
Engine.load(sys.argv[1]).warm_up()
print(set(seen) == {step_region.forward_signature()}, len(seen) > 0)
"""


def test_the_forward_signature_built_without_a_model_is_the_one_the_forward_passes():
    """What a cold start hands the second process before the weights are loaded."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = [sys.executable, "-c", SIGNATURE_SCRIPT, str(default_model_path())]
    out = subprocess.run(run, env=env, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    assert out.split() == ["True", "True"]


NESTED_SCRIPT = """
import sys
import numpy as np
from inference.engine.jit import stage_calls
from tests.inference.engine.jit import nested_kernels as k
a = np.zeros(1)
caller = getattr(k, sys.argv[1])
stage_calls.prepare(caller, (a,))
caller(a)
print(a[0])
"""


def test_a_caller_whose_direct_callee_comes_from_the_cache_finds_that_callees_sites(tmp_path):
    """A new caller of a cached kernel that makes pointer calls (bench/lab/prefill_breakdown after
    decode_breakdown): numba loads the kernel without typing it, so its sites are found by
    typing it anew, and get addresses."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "NUMBA_CACHE_DIR": str(tmp_path),
        "LMSERVE_COMPILE_SPLIT": "0",
    }
    env.pop("LMSERVE_NUMBA_CACHE_BASE", None)
    for caller in ("by_pointer", "direct"):  # the first fills the cache
        run = [sys.executable, "-c", NESTED_SCRIPT, caller]
        out = subprocess.run(run, env=env, cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == ["1.0"]
