"""A server on an empty numba cache says it compiles, reports progress, then serves.

The first start on a CPU (or after an engine update) compiles the engine's kernels for a
minute or more inside the worker's warm-up; the log must say so and keep reporting, so a user
is never left at a silent terminal (inference/engine/jit/compile_watch.py).
"""

from __future__ import annotations

import re

import pytest

from inference.engine.jit.numba_cache import BASE_VARIABLE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_a_server_on_an_empty_kernel_cache_says_it_compiles_and_reports_progress(start_server, tmp_path):
    empty = tmp_path / "numba"
    # The base variable too: the test process's own (inherited by the server) would win.
    server = start_server(env={"NUMBA_CACHE_DIR": str(empty), BASE_VARIABLE: str(empty)})
    logs = server.logs()
    assert "compiling the engine's kernels for this CPU into " + str(empty) in logs, logs
    assert re.search(r"compiling kernels: \d+ done in \d+ s, now \S+", logs), logs
    compiled = re.search(r"compiled (\d+) kernels in \d+ s", logs)
    assert compiled and int(compiled.group(1)) > 10, logs
    assert any(empty.rglob("*.nbi"))  # the kernels went to the cache the log named
