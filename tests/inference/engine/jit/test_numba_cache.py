"""numba's disk cache keyed by CPU and engine source (inference/engine/jit/numba_cache.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from inference.engine.jit.compile_watch import warm_up_notice
from inference.engine.jit.numba_cache import (
    BASE_VARIABLE,
    KEEP_DAYS,
    KEEP_NEWEST,
    STAMP,
    cache_key,
    host_cpu,
    prune_cache_dirs,
    source_digest,
)
from inference.engine.jit.numba_cache import ENGINE_DIR as ENGINE_DIR_HASHED

ROOT = Path(__file__).resolve().parents[4]
ENGINE_DIR = ROOT / "inference" / "engine"
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


def test_the_digest_covers_the_whole_engine():
    assert ENGINE_DIR_HASHED == ENGINE_DIR


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
    """A process that compiles a kernel, then sets the cache up as Engine.load does (the kernel
    is cached in the keyed directory either way); the directory it exports to children."""
    script = (
        "import os\n"
        "from inference.engine.quants.quantize import round_f16\n"
        "assert round_f16(1.0) == 1.0\n"
        "from inference.engine.jit.numba_cache import use_keyed_cache_dir\n"
        "use_keyed_cache_dir()\n"
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


def test_importing_the_engine_writes_nothing_and_sets_no_cache_directory(tmp_path):
    # Every module of the engine imported (every kernel defined), with HOME in a fresh
    # directory: no cache directory is created, none is exported, nothing is written beside
    # the sources. numba's own locators create a kernel's directory when it is defined.
    env = {k: v for k, v in os.environ.items() if k not in (BASE_VARIABLE, "XDG_CACHE_HOME")}
    env = {k: v for k, v in env.items() if not k.startswith("NUMBA_")}
    env["HOME"] = str(tmp_path)
    script = (
        "import importlib, os, pkgutil\n"
        "import inference.engine as engine\n"
        "for module in pkgutil.walk_packages(engine.__path__, 'inference.engine.'):\n"
        "    importlib.import_module(module.name)\n"
        "print(os.environ.get('NUMBA_CACHE_DIR', ''), os.environ.get('" + BASE_VARIABLE + "', ''))\n"
    )
    sources_before = sorted(ENGINE_DIR.rglob("*.nb[ic]"))
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == []
    assert list(tmp_path.iterdir()) == []
    assert sorted(ENGINE_DIR.rglob("*.nb[ic]")) == sources_before


def test_the_server_prunes_and_a_load_does_not(tmp_path):
    # Only lmserve's start removes old key directories; Engine.load (prune=False) stamps its own.
    now = time.time()
    old = _key_dir(tmp_path, 1, days_ago=KEEP_DAYS + 1, now=now)
    for n in range(2, 2 + KEEP_NEWEST):
        _key_dir(tmp_path, n, days_ago=0.0, now=now)
    env = {k: v for k, v in os.environ.items() if k != BASE_VARIABLE and not k.startswith("NUMBA_")}
    env["NUMBA_CACHE_DIR"] = str(tmp_path)
    script = (
        "import sys\n"
        "from inference.engine.jit.numba_cache import use_keyed_cache_dir\n"
        "print(use_keyed_cache_dir(prune=sys.argv[1] == 'prune'))\n"
    )
    run = [sys.executable, "-c", script]
    keyed = Path(
        subprocess.run([*run, "load"], cwd=ROOT, env=env, capture_output=True, text=True).stdout.strip()
    )
    assert keyed == tmp_path / cache_key(*host_cpu(), source_digest(), {})
    assert (keyed / STAMP).exists() and old.exists()
    subprocess.run([*run, "prune"], cwd=ROOT, env=env, check=True)
    assert not old.exists() and keyed.exists()


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
