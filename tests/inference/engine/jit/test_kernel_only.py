"""kernel_only: kernels without numba's entry wrappers, called by other kernels only."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from inference.engine.fused import step_region
from inference.engine.jit.kernel_only import KernelOnly, kernel_only


@kernel_only(cache=False)
def add_one(a):
    for i in range(a.shape[0]):
        a[i] += 1.0


@numba.njit
def calls_add_one(a):
    add_one(a)


def test_a_kernel_calls_it_and_python_gets_a_clear_error_not_a_crash():
    a = np.zeros(3)
    calls_add_one(a)
    np.testing.assert_array_equal(a, np.ones(3))
    with pytest.raises(TypeError, match="add_one is compiled to be called by other kernels only"):
        add_one(a)  # numba would jump to the Python entry it never compiled


def test_the_forward_region_and_its_stages_compile_without_wrappers():
    assert isinstance(step_region.run_stages, KernelOnly)
    assert step_region.run_stages.targetoptions["no_cpython_wrapper"]
    assert step_region.forward_rows.targetoptions["no_cfunc_wrapper"]  # called from Python: entry kept
