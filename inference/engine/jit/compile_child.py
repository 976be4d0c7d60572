"""The second process of a cold start's compile (compile_split.py): python -m
inference.engine.jit.compile_child, the caller's (module, name, argument types) pickled on
stdin. It finds the callees as the first process does and compiles those of
stage_calls.ELSEWHERE into numba's on-disk cache (the keyed directory the first process
exported), then reports what its typing found on stdout (stage_calls.typed_report).
"""

from __future__ import annotations

import importlib
import pickle
import sys
import time

from . import stage_calls


def main() -> None:
    """Find the callees of the caller pickled on stdin and compile those of
    stage_calls.ELSEWHERE into numba's on-disk cache."""
    started, cpu = time.perf_counter(), time.process_time()
    module, name, signature = pickle.loads(sys.stdin.buffer.read())
    caller = getattr(importlib.import_module(module), name)
    stage_calls.discover(caller, signature, "there")
    mine = [
        c
        for c in [stage_calls.Callee(caller, signature), *stage_calls.all_callees()]
        if stage_calls.compiled_elsewhere(c)
    ]
    for callee in mine:
        callee.function.compile(callee.argtypes)
    sys.stdout.buffer.write(pickle.dumps(stage_calls.typed_report()))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(f"compiled {len(mine)} kernels in {wall:.1f} s ({cpu:.1f} s CPU)", file=sys.stderr)


if __name__ == "__main__":
    main()
