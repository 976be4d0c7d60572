"""numba's disk cache keyed by CPU and engine source (inference/engine/numba_cache.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from inference.engine.jit.numba_cache import (
    BASE_VARIABLE,
    KEEP_DAYS,
    KEEP_NEWEST,
    STAMP,
    cache_key,
    host_cpu,
    prune_cache_dirs,
    source_digest,
    warm_up_notice,
)

ROOT = Path(__file__).resolve().parents[3]
FEATURES = "+avx2,+fma,-avx512f,-avx512vnni"


def test_the_key_changes_with_the_cpu_its_features_the_sources_and_numba_overrides():
    key = cache_key("znver4", FEATURES, "abc", {})
    assert key.startswith("znver4-")
    assert cache_key("znver4", ",".join(reversed(FEATURES.split(","))), "abc", {}) == key
    assert cache_key("znver4", "+avx2,+fma,+avx512f,+avx512vnni", "abc", {}) != key  # VNNI day
    assert cache_key("skylake", FEATURES, "abc", {}) != key
    assert cache_key("znver4", FEATURES, "abd", {}) != key
    assert cache_key("znver4", FEATURES, "abc", {"NUMBA_CPU_NAME": "generic"}) != key
    assert "/" not in cache_key("a/b c", FEATURES, "abc", {})


def test_source_digest_follows_every_file(tmp_path):
    # A kernel compiled into another file's kernel is not re-stamped by numba: any change to
    # any engine source must move the cache.
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    before = source_digest(tmp_path)
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    assert source_digest(tmp_path) != before


def _child(env: dict[str, str]) -> str:
    script = (
        "import os\n"
        "from inference.engine.quants.quantize import round_f16\n"
        "assert round_f16(1.0) == 1.0\n"
        "print(os.environ['NUMBA_CACHE_DIR'])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_kernels_are_cached_under_the_keyed_directory_and_children_do_not_nest(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != BASE_VARIABLE and not k.startswith("NUMBA_")}
    env["NUMBA_CACHE_DIR"] = str(tmp_path)
    keyed = Path(_child(env))
    assert keyed == tmp_path / cache_key(*host_cpu(), source_digest(), {})
    assert list(tmp_path.iterdir()) == [keyed]  # nothing cached outside the key
    assert (keyed / STAMP).exists()  # its last use, for pruning
    assert any(keyed.rglob("quantize.round_f16*.nbi"))
    # A child inherits the keyed directory and the base, and keys from the base again.
    assert Path(_child({**env, "NUMBA_CACHE_DIR": str(keyed), BASE_VARIABLE: str(tmp_path)})) == keyed


def test_without_numba_cache_dir_kernels_go_to_the_keyed_default_never_beside_the_sources(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != BASE_VARIABLE and not k.startswith("NUMBA_")}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    keyed = Path(_child(env))
    assert keyed == tmp_path / "lmserve" / "numba" / cache_key(*host_cpu(), source_digest(), {})
    assert any(keyed.rglob("quantize.round_f16*.nbi"))


def test_the_warm_up_notice_says_whether_kernels_will_be_compiled(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert warm_up_notice().startswith("compiling the engine's kernels for this CPU")
    (tmp_path / "models_abc").mkdir()
    (tmp_path / "models_abc" / "step_region.forward_rows-1.py311.nbi").write_bytes(b"")
    assert warm_up_notice() == f"loading the engine's compiled kernels from {tmp_path}"


def _key_dir(base: Path, n: int, days_ago: float, now: float) -> Path:
    directory = base / cache_key(f"cpu{n}", FEATURES, "abc", {})
    directory.mkdir()
    (directory / "kernel.nbi").write_bytes(b"")
    (directory / STAMP).touch()
    os.utime(directory / STAMP, (now - days_ago * 86400, now - days_ago * 86400))
    return directory


def test_old_kernel_directories_are_pruned_keeping_recent_ones_and_foreign_files(tmp_path):
    now = 1_900_000_000.0
    recent = [_key_dir(tmp_path, n, days_ago=n * 0.5, now=now) for n in range(3)]  # within KEEP_DAYS
    old = [_key_dir(tmp_path, 10 + n, days_ago=KEEP_DAYS + 1 + n, now=now) for n in range(4)]
    foreign = tmp_path / "not-a-key-dir"
    foreign.mkdir()
    os.utime(foreign, (0, 0))
    removed = prune_cache_dirs(tmp_path, now=now)
    # The KEEP_NEWEST most recently used stay even when old: here the 3 recent and the newest old.
    kept_old = old[: KEEP_NEWEST - len(recent)]
    assert sorted(removed) == sorted(set(old) - set(kept_old))
    assert sorted(p for p in tmp_path.iterdir()) == sorted([*recent, *kept_old, foreign])
    assert prune_cache_dirs(tmp_path, now=now) == []
