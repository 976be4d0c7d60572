"""Kernels only other kernels call, compiled without numba's entry wrappers.

numba compiles two wrappers beside every kernel: one unboxing Python arguments (the entry a
call from Python takes) and one with the C calling convention (for ``cfunc``-style use). A
kernel that runs only inside other kernels, directly or through a pointer (stage_calls.py),
uses neither, and for the fused forward's stages, whose arguments are named tuples of a dozen
arrays, the wrappers were ~10% of a cold start's compiling (SmolLM2, one process: 22.7 s CPU
with every kernel's wrappers, 20.2 without). ``kernel_only`` leaves both out; calling such
a kernel from Python raises TypeError (numba would jump to a wrapper that does not exist).
"""

from __future__ import annotations

from numba.core.registry import CPUDispatcher


class KernelOnly(CPUDispatcher):
    """A numba dispatcher whose kernels have no Python entry: only other kernels call them."""

    def __call__(self, *args, **kwargs):
        name = self.py_func.__qualname__
        raise TypeError(f"{name} is compiled to be called by other kernels only (it has no Python entry)")


def kernel_only(cache: bool = True, **options):
    """Like ``numba.njit(cache=cache, **options)`` for a kernel only other kernels call."""

    def decorate(function) -> KernelOnly:
        targetoptions = {"nopython": True, "no_cpython_wrapper": True, "no_cfunc_wrapper": True, **options}
        dispatcher = KernelOnly(function, targetoptions=targetoptions)
        if cache:
            dispatcher.enable_caching()
        return dispatcher

    return decorate
