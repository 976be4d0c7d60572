"""Which instruction selection the integer dot products use (quants/intdot_ir.py).

Three selections give the same int32 lanes, hence the same float bits:

- ``vnni``: ``vpdpbusd`` (AVX-512 VNNI with AVX-512 VL, or AVX-VNNI): four byte products
  summed into each int32 lane in one instruction;
- ``avx2``: ggml's ``pmaddubsw`` + ``pmaddwd`` sequence;
- ``generic``: plain vector IR that LLVM lowers to whatever the CPU has.

A kernel exists once per selection: ``for_selection`` compiles a Python function for one of
them, and the function passes the selection on to its intrinsics as a constant.

The best one the CPU has is chosen once, at import. ``LMSERVE_SIMD`` overrides it (to test or
measure another path on the same machine); it joins the numba cache key (numba_cache.py), so
kernels built for one selection are never served to another. Asking for a selection the CPU
lacks is an error that names the missing features. Importing this module compiles nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numba
from numba import types

SIMD_VARIABLE = "LMSERVE_SIMD"
SELECTIONS = ("vnni", "avx2", "generic")  # best first
# Each selection's alternatives: it runs when every feature of one alternative is present.
REQUIRED_FEATURES = {
    "vnni": (("avx2", "avx512vnni", "avx512vl"), ("avx2", "avxvnni")),
    "avx2": (("avx2",),),
    "generic": ((),),
}


class SimdError(RuntimeError):
    """LMSERVE_SIMD names no selection, or one this CPU cannot run."""


def target_features() -> frozenset[str]:
    """The CPU features numba compiles for: NUMBA_CPU_FEATURES when set, else the host's."""
    flat = os.environ.get("NUMBA_CPU_FEATURES")
    if not flat:
        from llvmlite import binding

        flat = binding.get_host_cpu_features().flatten()
    return frozenset(f[1:] for f in flat.split(",") if f.startswith("+"))


def missing_features(simd: str, features: frozenset[str]) -> tuple[str, ...]:
    """What the CPU lacks for ``simd`` (the shortest shortfall among its alternatives); ()
    when it can run it."""
    shortfalls = [tuple(f for f in need if f not in features) for need in REQUIRED_FEATURES[simd]]
    return min(shortfalls, key=len)


def choose_simd(features: frozenset[str], requested: str | None = None) -> str:
    """``requested`` (LMSERVE_SIMD's value) if given and runnable, else the best selection
    ``features`` allow. Raises SimdError for an unknown or unrunnable request."""
    if requested:
        if requested not in SELECTIONS:
            raise SimdError(f"{SIMD_VARIABLE}={requested!r}: expected one of {', '.join(SELECTIONS)}")
        missing = missing_features(requested, features)
        if missing:
            raise SimdError(f"{SIMD_VARIABLE}={requested}: this CPU lacks {', '.join(missing)}")
        return requested
    return next(s for s in SELECTIONS if not missing_features(s, features))


def host_simd() -> str:
    """The selection for this process (LMSERVE_SIMD or the best the CPU has)."""
    return choose_simd(target_features(), os.environ.get(SIMD_VARIABLE) or None)


def for_selection(kernel: Callable, simd: str, **options) -> Callable:
    """``kernel`` compiled for one instruction selection, named ``{simd}_{name}``.

    ``kernel`` is a closure that reads ``simd`` from its enclosing factory: numba types a
    closure's string as a literal, so each intrinsic ``kernel`` passes it to emits that
    selection's instructions, and numba's disk cache keys the compiled code on it (the index
    hashes closure values). The name gives each selection's copy its own cache file and
    makes it findable in a profile. ``options`` go to ``numba.njit`` beside ``cache=True``."""
    kernel.__name__ = kernel.__qualname__ = f"{simd}_{kernel.__name__}"
    return numba.njit(cache=True, **options)(kernel)


def literal_strings(*values) -> tuple[str, ...] | None:
    """The values of string-literal argument types, or None when any is not yet literal (an
    intrinsic's typing then returns None, and numba retries with the literal types)."""
    if not all(isinstance(v, types.StringLiteral) for v in values):
        return None
    return tuple(v.literal_value for v in values)
