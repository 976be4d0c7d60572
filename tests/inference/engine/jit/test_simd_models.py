"""Whole models give bitwise the same logits in every instruction selection (simd.py).

Each selection runs in a process of its own (LMSERVE_SIMD is read once, at import, and keys
the numba cache): synthetic models whose matrices hold every block format (the fused step's
int8 and packed-nibble kernels, the expert path's) and SmolLM2 (Q4_1 nibbles), each through a
multi-row verify runs (the row-block kernels: file blocks read as they are below 32 rows,
unpacked from 32, one-row kernels per row for 2 rows) and one-token decode steps (the pair
kernels).
A selection the CPU lacks is skipped naming the missing features. Slow: each selection
compiles the engine's kernels once (kept in its own numba cache directory).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inference.engine.jit.simd import SELECTIONS, SIMD_VARIABLE, missing_features, target_features
from inference.model_files import DEFAULT_MODEL_FILE, DEFAULT_MODEL_PACKAGE, installed_file
from tests.fixtures.synthetic_gguf import synthetic_path

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[4]
ARCHS = ("llama", "qwen3moe")  # every 32- and 16-wide format; the fused step and the expert path
CHILD = """
import hashlib, json, sys
import numpy as np
from inference.engine.engine import Engine
from inference.engine.fused.attention_tile import LANES
from inference.engine.quants.intdot import HOST_SIMD
from inference.engine.quants.tiles import WIDE
digests = {}
for path in sys.argv[1:]:
    engine = Engine.load(path)
    tokens = np.random.default_rng(0).integers(3, min(engine.config.vocab_size, 5000), 60).tolist()
    cache = engine.new_cache(64)
    logits = [engine.verify(cache, tokens[:16]), engine.verify(cache, tokens[16:20])]
    logits += [engine.verify(cache, tokens[20:22]), engine.verify(cache, tokens[22:56])]
    logits += [engine.decode_one(cache, t)[None] for t in tokens[56:]]
    digests[path] = hashlib.sha256(np.concatenate(logits).astype(np.float32).tobytes()).hexdigest()
print(json.dumps({"simd": HOST_SIMD, "wide": WIDE, "lanes": LANES, "digests": digests}))
"""
# A CPU with AVX-VNNI but no AVX-512 (Alder Lake and later client cores): numba compiles for it
# on this machine when told to, and this machine runs that code if it has AVX-VNNI itself. The
# vnni selection then takes its 256-bit tiles and 8-lane attention.
AVX_VNNI_CPU = "alderlake"


def _without_avx512() -> str:
    """This CPU's LLVM feature string with every AVX-512 feature turned off."""
    from llvmlite import binding

    flags = binding.get_host_cpu_features().flatten().split(",")
    return ",".join("-" + f[1:] if f[1:].startswith("avx512") else f for f in flags)


def _child_run(simd: str, paths: list[str], target: dict[str, str] | None = None) -> dict:
    """The child's selection, its tile and attention widths, and each model's logit digest."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k != SIMD_VARIABLE and k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")
    }
    env[SIMD_VARIABLE] = simd
    env.update(target or {})
    out = subprocess.run(
        [sys.executable, "-c", CHILD, *paths], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["simd"] == simd
    return result


def _logit_digests(simd: str, paths: list[str]) -> dict[str, str]:
    return _child_run(simd, paths)["digests"]


@pytest.fixture(scope="module")
def model_paths(synthetic_dir) -> list[str]:
    paths = [str(synthetic_path(arch, synthetic_dir)) for arch in ARCHS]
    smollm2 = installed_file(DEFAULT_MODEL_PACKAGE, DEFAULT_MODEL_FILE)
    return paths + ([str(smollm2)] if smollm2 else [])


@pytest.fixture(scope="module")
def generic_digests(model_paths) -> dict[str, str]:
    return _logit_digests("generic", model_paths)


@pytest.mark.parametrize("simd", [s for s in SELECTIONS if s != "generic"])
def test_logits_are_bitwise_equal_across_selections(simd, model_paths, generic_digests):
    missing = missing_features(simd, target_features())
    if missing:
        pytest.skip(f"the CPU lacks {', '.join(missing)} for the {simd} selection")
    assert any("SmolLM2" in p for p in model_paths), "SmolLM2 is not installed"
    assert _logit_digests(simd, model_paths) == generic_digests


def test_avx_vnni_without_avx512_gives_the_generic_bits(model_paths):
    # Compiled as for a CPU without AVX-512, both selections run their 256-bit code (the vnni
    # tiles through AVX-VNNI's vpdpbusd, attention in 8 lanes) and must agree bit for bit.
    if "avxvnni" not in target_features():
        pytest.skip("the CPU lacks avxvnni: it cannot run code built for an AVX-VNNI CPU")
    target = {"NUMBA_CPU_NAME": AVX_VNNI_CPU, "NUMBA_CPU_FEATURES": _without_avx512()}
    vnni = _child_run("vnni", model_paths, target)
    assert (vnni["wide"], vnni["lanes"]) == (False, 8)  # the 256-bit code, not this CPU's 512-bit
    assert vnni["digests"] == _child_run("generic", model_paths, target)["digests"]
