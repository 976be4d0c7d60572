"""Fleet test fixtures: a real Redis server and a real Celery worker process (never a mock).

``redis-server`` is Debian's package (``scripts/test.py`` installs it); it runs in the
foreground on a free port with persistence off. The worker runs from the checkout against a
fresh SQLite database of its own data directory, which the test's ``manage.py`` subprocesses
share (pytest-django's test database lives in memory, out of the worker's reach).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REDIS = os.environ.get("LMSERVE_REDIS_SERVER", "/usr/bin/redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(condition, timeout: float, what: str, logs) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} not ready after {timeout} s:\n{logs()}")


def _stop(process: subprocess.Popen, timeout: float = 30.0) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class RedisServer:
    """A redis-server of our own on a free port, persistence off."""

    process: subprocess.Popen
    url: str

    @classmethod
    def start(cls, log_dir: Path) -> RedisServer:
        if not (Path(REDIS).exists() or shutil.which(REDIS)):
            pytest.fail(
                f"no redis-server at {REDIS}: run scripts/test.py (it installs Debian's redis-server)"
            )
        import redis

        port = free_port()
        log = log_dir / "redis.log"
        args = [REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        process = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT)

        def pong() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"redis-server exited:\n{log.read_text()}")
            try:
                return redis.Redis(port=port, socket_timeout=1).ping()
            except redis.ConnectionError:
                return False

        _wait(pong, 30, "redis-server", log.read_text)
        return cls(process, f"redis://127.0.0.1:{port}/0")

    def stop(self) -> None:
        _stop(self.process)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory) -> str:
    """A redis-server of our own on a free port; its URL."""
    server = RedisServer.start(tmp_path_factory.mktemp("redis"))
    yield server.url
    server.stop()


def start_worker(env: dict, log: Path, concurrency: int = 2, new_session: bool = False) -> subprocess.Popen:
    """``celery worker`` from the checkout, ready (its " ready." line logged). ``new_session``:
    in a process group of its own, so that the whole worker can be killed at once."""
    flags = "-A lmserve_site.celery worker --loglevel INFO --pool prefork --without-gossip --without-mingle"
    args = [sys.executable, "-m", "celery", *flags.split(), "--without-heartbeat"]
    args += ["--concurrency", str(concurrency), "--hostname", f"test-{log.stem}@%h"]
    worker = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=new_session
    )

    def ready() -> bool:
        if worker.poll() is not None:
            raise RuntimeError(f"the celery worker exited:\n{log.read_text()}")
        return " ready." in log.read_text()

    _wait(ready, 120, "celery worker", log.read_text)
    return worker


def manage(env: dict, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``manage.py ARGS`` in a child process with ``env``, its output captured."""
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@dataclass
class CeleryWorld:
    """The environment a test's subprocesses share with the worker."""

    env: dict
    data_dir: Path
    worker_log: Path
    worker_pid: int = 0

    def manage(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return manage(self.env, *args, timeout=timeout)

    def rows(self, sql: str, *params) -> list[dict]:
        with sqlite3.connect(self.data_dir / "db.sqlite3") as db:
            db.row_factory = sqlite3.Row
            return [dict(r) for r in db.execute(sql, params)]


@pytest.fixture(scope="module")
def celery_world(redis_url, tmp_path_factory) -> CeleryWorld:
    """A migrated data directory and a Celery worker (2 processes) on the Redis above."""
    data = tmp_path_factory.mktemp("celery-data")
    env = {**os.environ, "LMSERVE_DATA_DIR": str(data), "CELERY_BROKER_URL": redis_url}
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("LMSERVE_MODEL", None)
    world = CeleryWorld(env, data, data / "worker.log")
    migrated = world.manage("migrate", "--noinput")
    assert migrated.returncode == 0, migrated.stderr
    worker = start_worker(env, world.worker_log)
    world.worker_pid = worker.pid
    yield world
    _stop(worker, 60)
