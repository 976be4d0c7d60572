"""The choice of instruction selection (inference/engine/jit/simd.py) and its override."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from inference.engine.jit.numba_cache import cache_key
from inference.engine.jit.simd import SIMD_VARIABLE, SimdError, choose_simd, missing_features

ROOT = Path(__file__).resolve().parents[4]
ZEN4 = frozenset({"avx2", "fma", "avx512f", "avx512vl", "avx512vnni"})
ALDER_LAKE = frozenset({"avx2", "fma", "avxvnni"})
HASWELL = frozenset({"avx2", "fma"})
OLD = frozenset({"sse4.2"})


def test_the_best_selection_the_cpu_has_is_chosen():
    assert choose_simd(ZEN4) == "vnni"
    assert choose_simd(ALDER_LAKE) == "vnni"  # AVX-VNNI: the same vpdpbusd, VEX-encoded
    assert choose_simd(HASWELL) == "avx2"
    assert choose_simd(frozenset({"avx2", "avx512vnni"})) == "avx2"  # the 256-bit form needs VL
    assert choose_simd(OLD) == "generic"


def test_the_override_wins_and_an_impossible_one_names_what_is_missing():
    assert choose_simd(ZEN4, "avx2") == "avx2"
    assert choose_simd(ZEN4, "generic") == "generic"
    assert missing_features("vnni", HASWELL) == ("avxvnni",)
    with pytest.raises(SimdError, match="LMSERVE_SIMD=vnni: this CPU lacks avxvnni"):
        choose_simd(HASWELL, "vnni")
    with pytest.raises(SimdError, match="LMSERVE_SIMD=avx2: this CPU lacks avx2"):
        choose_simd(OLD, "avx2")
    with pytest.raises(SimdError, match=r"LMSERVE_SIMD='sse': expected one of vnni, avx2, generic"):
        choose_simd(ZEN4, "sse")


def test_the_override_is_part_of_the_cache_key():
    key = cache_key("znver5", "+avx2,+avx512vnni", "abc", {})
    assert cache_key("znver5", "+avx2,+avx512vnni", "abc", {SIMD_VARIABLE: "avx2"}) != key
    assert cache_key("znver5", "+avx2,+avx512vnni", "abc", {SIMD_VARIABLE: "generic"}) != cache_key(
        "znver5", "+avx2,+avx512vnni", "abc", {SIMD_VARIABLE: "avx2"}
    )


def _child(simd: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = (
        "from inference.engine.jit.numba_cache import kernel_cache_dir\n"
        "from inference.engine.quants.intdot import HOST_SIMD\n"
        "print(HOST_SIMD, kernel_cache_dir())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "LMSERVE_"))}
    env.update({SIMD_VARIABLE: simd, "NUMBA_CACHE_DIR": str(tmp_path)})
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)


def test_a_process_runs_the_selection_it_is_told_in_a_cache_directory_of_its_own(tmp_path):
    generic, best = _child("generic", tmp_path), _child("", tmp_path)
    assert generic.returncode == 0, generic.stderr
    selection, directory = generic.stdout.split()
    assert selection == "generic"
    assert directory != best.stdout.split()[1]  # never the default selection's kernels
    bad = _child("avx9", tmp_path)
    assert bad.returncode != 0 and "LMSERVE_SIMD='avx9': expected one of vnni, avx2, generic" in bad.stderr
