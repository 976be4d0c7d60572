"""Compiling a list of kernels, on a cold start shared with a second process.

(Placeholder of the first step: everything in this process.)
"""

from __future__ import annotations


def compile_all(callees: list, split: bool) -> None:
    """Compile (or load from numba's cache) every callee for its argument types."""
    for callee in callees:
        callee.function.compile(callee.argtypes)
