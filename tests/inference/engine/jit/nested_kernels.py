"""Kernels for test_stage_calls: a function making pointer calls (``middle``) reached both
through a site and by a direct call, cached on disk."""

from __future__ import annotations

import numba

from inference.engine.jit.stage_calls import Sites


@numba.njit(cache=True)
def leaf(a):
    a[0] += 1.0


LEAF_SITES = Sites("test_nested_leaf")
LEAF_AT = LEAF_SITES.add(leaf)
leaf_call = LEAF_SITES.call


@numba.njit(cache=True)
def middle(a):
    leaf_call(LEAF_AT, (a,))


MIDDLE_SITES = Sites("test_nested_middle")
MIDDLE_AT = MIDDLE_SITES.add(middle, LEAF_SITES)
middle_call = MIDDLE_SITES.call


@numba.njit(cache=True)
def by_pointer(a):
    middle_call(MIDDLE_AT, (a,))


@numba.njit  # not cached: typed in every process, its direct callee loaded from the cache
def direct(a):
    middle(a)
