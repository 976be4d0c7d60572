"""numba's on-disk cache in a directory of its own per CPU and per engine source.

numba stamps a cached kernel with the CPU it was built for and with a stamp of the one file
that defines it, not with the files of the kernels it calls and compiles into itself:
edit quants/intdot_ir.py and the fused step cached from step_region.py keeps running the old
dot product (it happened while this module was written). And a home directory shared by
machines with different instruction sets (AVX-512 VNNI on some days, AVX2 only on others) should
never hand one machine's code to another. So the cache lives in a subdirectory of
NUMBA_CACHE_DIR named by the CPU and a hash of its features and of every engine source file:
another CPU or any change to the engine's code gives an empty directory, and numba compiles.
Each load stamps its directory's last use; the server's start removes directories unused for
a week (``prune_cache_dirs``), so engine updates do not pile up kernels nobody loads.

numba fixes a kernel's cache directory when the ``cache=True`` function is decorated (its
locator, tried in numba's list of them) and, with its own locators, creates that directory
there and then: importing a kernel module would write to the disk. ``KeyedCacheLocator`` goes
first in that list (``install_cache_locator``, run when the ``inference.engine`` package is
imported: memory only): it names the keyed directory, hashing the sources once, when the first
kernel is defined, and creates nothing; numba creates the directory when it saves a kernel.
``use_keyed_cache_dir`` (``Engine.load`` and the commands) creates and stamps it and exports it
to child processes; only ``lmserve`` prunes old ones.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import time
from pathlib import Path

from numba.core.caching import CacheImpl, _CacheLocator, _SourceFileBackedLocatorMixin

from .simd import SIMD_VARIABLE

ENGINE_DIR = Path(__file__).resolve().parents[1]  # inference/engine: every source of it is hashed
# The directory the user asked for, remembered so that child processes (which inherit the keyed
# NUMBA_CACHE_DIR) key from it again instead of nesting one key inside another.
BASE_VARIABLE = "LMSERVE_NUMBA_CACHE_BASE"
# numba's own overrides of what it compiles for, and the engine's choice of instructions for the
# integer dot products (simd.py): they change the code, so they join the key.
NUMBA_TARGET_VARIABLES = ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NUMBA_OPT", SIMD_VARIABLE)
# Every engine update leaves a directory of kernels behind (~10-20 MB). Directories used within
# KEEP_DAYS stay (another checkout, CPU or selection may still use them), and so do the KEEP_NEWEST
# most recently used; older ones are removed when the server starts (lmserve).
KEEP_DAYS = 7
KEEP_NEWEST = 4
STAMP = "last-used"
KEY_NAME = re.compile(r"[A-Za-z0-9_-]+-[0-9a-f]{16}")


def host_cpu() -> tuple[str, str]:
    """(LLVM's name of this CPU, its feature string) as numba compiles for them."""
    from llvmlite import binding

    return binding.get_host_cpu_name(), binding.get_host_cpu_features().flatten()


def source_digest(root: Path = ENGINE_DIR) -> str:
    """A hash of every engine source file's path and bytes."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def cache_key(cpu_name: str, features: str, sources: str, overrides: dict[str, str]) -> str:
    """The subdirectory name: the CPU's name (readable) and a hash of everything that changes
    the compiled code."""
    parts = [cpu_name, ",".join(sorted(features.split(","))), sources]
    parts += [f"{name}={overrides[name]}" for name in sorted(overrides)]
    safe_name = "".join(c if c.isalnum() or c in "-_" else "_" for c in cpu_name) or "cpu"
    return f"{safe_name}-{hashlib.sha256(chr(0).join(parts).encode()).hexdigest()[:16]}"


def keyed_cache_dir(base: str | os.PathLike) -> Path:
    """Where this process's kernels are cached under ``base``."""
    name, features = host_cpu()
    overrides = {v: os.environ[v] for v in NUMBA_TARGET_VARIABLES if os.environ.get(v)}
    return Path(base) / cache_key(name, features, source_digest(), overrides)


def prune_cache_dirs(base: Path, now: float | None = None) -> list[Path]:
    """Remove the key directories under ``base`` unused for KEEP_DAYS, beyond the KEEP_NEWEST
    most recently used. Only directories named like a key are touched. Returns those removed."""
    now = time.time() if now is None else now
    keyed = [d for d in base.iterdir() if d.is_dir() and KEY_NAME.fullmatch(d.name)]
    by_use = sorted(keyed, key=_last_used, reverse=True)
    stale = [d for d in by_use[KEEP_NEWEST:] if now - _last_used(d) > KEEP_DAYS * 86400]
    for directory in stale:
        shutil.rmtree(directory, ignore_errors=True)
    return stale


def _last_used(directory: Path) -> float:
    stamp = directory / STAMP
    return (stamp if stamp.exists() else directory).stat().st_mtime


def default_cache_base() -> Path:
    """Where kernels are cached when NUMBA_CACHE_DIR is unset. Never numba's own default (beside
    the sources, stamped per file): that one kept stale kernels compiled into others after a
    `git pull` changed the engine."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "lmserve" / "numba"


def cache_base() -> Path:
    """The directory the key directories sit in: the one the user asked for (NUMBA_CACHE_DIR,
    or the base a parent process exported with its keyed NUMBA_CACHE_DIR), else
    default_cache_base()."""
    return Path(os.environ.get(BASE_VARIABLE) or os.environ.get("NUMBA_CACHE_DIR") or default_cache_base())


@functools.cache
def kernel_cache_dir() -> Path:
    """Where this process's kernels are cached: the keyed subdirectory of cache_base(), named
    once per process (the sources are hashed the first time)."""
    return keyed_cache_dir(cache_base())


class KeyedCacheLocator(_SourceFileBackedLocatorMixin, _CacheLocator):
    """numba's cache locator for every kernel with a source file: kernel_cache_dir(), beside
    nothing. Unlike numba's locators it creates no directory when a kernel is defined (numba
    creates it before saving the first kernel), so importing a kernel module writes nothing."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = str(kernel_cache_dir() / self.get_suitable_cache_subpath(py_file))

    def get_cache_path(self):
        return self._cache_path

    @classmethod
    def from_function(cls, py_func, py_file):
        if not os.path.exists(py_file) or not _writable(kernel_cache_dir()):
            return None  # (a notebook cell, a zipped module, a read-only cache: numba's locators decide)
        return cls(py_func, py_file)


@functools.cache
def _writable(directory: Path) -> bool:
    """Whether ``directory``, or the nearest of its parents that exists, may be written to (a
    question, not a write)."""
    existing = next(p for p in (directory, *directory.parents) if p.exists())
    return os.access(existing, os.W_OK)


def install_cache_locator() -> None:
    """Put KeyedCacheLocator first in numba's list of locators (idempotent; memory only). It
    must run before any ``cache=True`` kernel is defined: the package's import runs it."""
    if KeyedCacheLocator not in CacheImpl._locator_classes:
        CacheImpl._locator_classes.insert(0, KeyedCacheLocator)


def use_keyed_cache_dir(prune: bool = False) -> Path:
    """Create and stamp kernel_cache_dir() (its last use, for pruning) and export it, with its
    base, to child processes (the second compiling process inherits both). ``prune``: remove
    key directories unused for KEEP_DAYS (prune_cache_dirs); the server's command does, once
    per start. Returns the directory."""
    keyed = kernel_cache_dir()
    base = keyed.parent
    try:
        keyed.mkdir(parents=True, exist_ok=True)
        (keyed / STAMP).touch()
        if prune:
            prune_cache_dirs(base)
    except OSError:  # a read-only or vanished cache is numba's to report, not start-up's
        pass
    os.environ[BASE_VARIABLE] = str(base)
    os.environ["NUMBA_CACHE_DIR"] = str(keyed)
    return keyed
