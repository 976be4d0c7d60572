"""Real servers for the API tests: ``manage.py lmserve`` subprocesses on real sockets.

The session server serves the default model with an API key, a one-deep queue and a small
context, so the queue-full and prompt-too-long cases are cheap to reach. Tests that need
other flags or that stop the server start their own through ``start_server``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "test-key-123"
MAIN_SERVER_FLAGS = ["--api-key", API_KEY, "--queue", "1", "--conns", "8", "--ctx", "1024", "--kv-slots", "2"]
START_TIMEOUT = 600.0  # a cold numba cache compiles every kernel on the first start
POLL = 0.05


class ServerProcess:
    """One ``manage.py`` server subprocess with its logs in ``log_dir``."""

    def __init__(self, args: list[str], log_dir: Path, announce: str = "lmserve: serving"):
        self.log_dir = log_dir
        self.stdout_path = log_dir / "stdout.txt"
        self.stderr_path = log_dir / "stderr.txt"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "LMSERVE_LOG_LEVEL": "INFO"}
        env.pop("LMSERVE_MODEL", None)
        env.pop("LMSERVE_API_KEY", None)
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=env,
            stdout=self.stdout_path.open("w"),
            stderr=self.stderr_path.open("w"),
        )
        self.announce = announce
        self.url = ""

    def logs(self) -> str:
        return self.stdout_path.read_text() + self.stderr_path.read_text()

    def wait_listening(self, timeout: float = 60.0) -> str:
        """The base URL, read from the server's announcement line."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.stdout_path.read_text().splitlines():
                if line.startswith(self.announce):
                    self.url = line.split()[-1].rstrip("/")
                    return self.url
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.logs()}")
            time.sleep(POLL)
        raise TimeoutError(f"server did not announce its address:\n{self.logs()}")

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.logs()}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(POLL)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.logs()}")

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def wait_until(self, condition, timeout: float = 60.0) -> dict:
        """Poll /health until ``condition(health)`` holds; return that health."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            health = self.health()
            if condition(health):
                return health
            time.sleep(POLL)
        raise TimeoutError(f"condition not reached; last health {health}")

    def wait_idle(self, timeout: float = 60.0) -> dict:
        return self.wait_until(lambda h: h["queued"] == 0 and h["in_flight"] == 0, timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_lmserve(log_dir: Path, *flags: str) -> ServerProcess:
    """``manage.py lmserve`` on a free port with the default model, ready to serve."""
    server = ServerProcess(["lmserve", "--port", "0", *flags], log_dir)
    try:
        server.wait_listening()
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> ServerProcess:
    """The shared lmserve server (see MAIN_SERVER_FLAGS)."""
    proc = start_lmserve(tmp_path_factory.mktemp("lmserve-main"), *MAIN_SERVER_FLAGS)
    yield proc
    alive = proc.process.poll() is None
    code = proc.stop()
    assert alive, f"the shared server died during the tests:\n{proc.logs()}"
    assert code == 0, f"the shared server did not exit cleanly ({code}):\n{proc.logs()}"


@pytest.fixture
def idle_server(server) -> ServerProcess:
    """The shared server, with no work left over from an earlier test."""
    server.wait_idle()
    return server


@pytest.fixture
def client(idle_server) -> openai.OpenAI:
    with openai.OpenAI(base_url=idle_server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture
def http(idle_server) -> httpx.Client:
    """Raw HTTP to the shared server, key included."""
    headers = {"authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=idle_server.url, headers=headers, timeout=120) as c:
        yield c


@pytest.fixture
def start_server(tmp_path):
    """Start extra lmserve servers with their own flags; stopped after the test."""
    started: list[ServerProcess] = []

    def start(*flags: str) -> ServerProcess:
        log_dir = tmp_path / f"server{len(started)}"
        log_dir.mkdir()
        proc = start_lmserve(log_dir, *flags)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
