"""Real servers for the API tests (``manage.py lmserve`` subprocesses on real sockets), and the
helpers the API tests share: SDK clients, readers of SDK replies and streams, and drivers that
run the dialect encoders without a server.

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

import anthropic
import httpx
import openai
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from openai._models import construct_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from api.errors import ApiError
from inference.types import Error, Finish

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "test-key-123"
MAIN_SERVER_FLAGS = ["--api-key", API_KEY, "--queue", "1", "--conns", "8", "--ctx", "1024", "--kv-slots", "2"]
START_TIMEOUT = 600.0  # a cold numba cache compiles every kernel on the first start
POLL = 0.05
# The function-calling tests' tool schema and question, shared by every dialect's tests.
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class ServerProcess:
    """One ``manage.py`` server subprocess with its logs in ``log_dir``."""

    def __init__(
        self,
        args: list[str],
        log_dir: Path,
        announce: str = "lmserve: serving",
        env: dict | None = None,
        sigint_ignored: bool = False,
    ):
        """``sigint_ignored``: start the server as a shell's background job is started, with
        SIGINT ignored (inherited), whatever the test runner's own disposition is."""
        self.log_dir = log_dir
        self.stdout_path = log_dir / "stdout.txt"
        self.stderr_path = log_dir / "stderr.txt"
        base = {**os.environ, "PYTHONUNBUFFERED": "1", "LMSERVE_LOG_LEVEL": "INFO"}
        for name in ("LMSERVE_MODEL", "LMSERVE_API_KEY", "LMSERVE_ALLOWED_HOSTS"):
            base.pop(name, None)
        # A database of its own (migrated at start), not the checkout's: servers of tests that
        # run side by side (pytest -n) would migrate one file at once, and no test should write
        # into a developer's database.
        base["LMSERVE_DATA_DIR"] = str(log_dir / "data")
        env = {**base, **(env or {})}
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=env,
            stdout=self.stdout_path.open("w"),
            stderr=self.stderr_path.open("w"),
            preexec_fn=_ignore_sigint if sigint_ignored else _default_sigint,
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


def start_lmserve(log_dir: Path, *flags: str, env: dict | None = None) -> ServerProcess:
    """``manage.py lmserve`` on a free port with the default model, ready to serve."""
    server = ServerProcess(["lmserve", "--port", "0", *flags], log_dir, env=env)
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
    with openai_client(idle_server) as c:
        yield c


@pytest.fixture(scope="module")
def oai(model_server) -> openai.OpenAI:
    """An openai client for the server a test module starts for itself as ``model_server``."""
    with openai_client(model_server, timeout=600) as c:
        yield c


@pytest.fixture(scope="module")
def claude(model_server) -> anthropic.Anthropic:
    """An anthropic client for the test module's own ``model_server``."""
    with anthropic_client(model_server, timeout=600) as c:
        yield c


@pytest.fixture
def http(idle_server) -> httpx.Client:
    """Raw HTTP to the shared server, key and JSON content type included."""
    headers = {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
    with httpx.Client(base_url=idle_server.url, headers=headers, timeout=120) as c:
        yield c


@pytest.fixture
def start_server(tmp_path):
    """Start extra lmserve servers with their own flags; stopped after the test."""
    started: list[ServerProcess] = []

    def start(*flags: str, env: dict | None = None) -> ServerProcess:
        log_dir = tmp_path / f"server{len(started)}"
        log_dir.mkdir()
        proc = start_lmserve(log_dir, *flags, env=env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


# -- SDK clients ---------------------------------------------------------------------------------
def openai_client(server: ServerProcess, timeout: float = 120.0, api_key: str = API_KEY) -> openai.OpenAI:
    """An openai SDK client for ``server`` that never retries, so a failure shows as it is."""
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=timeout)


def anthropic_client(
    server: ServerProcess, timeout: float = 120.0, api_key: str = API_KEY
) -> anthropic.Anthropic:
    """An anthropic SDK client for ``server`` that never retries."""
    return anthropic.Anthropic(base_url=server.url, api_key=api_key, max_retries=0, timeout=timeout)


# -- reading SDK replies and streams -------------------------------------------------------------
def chat_stream_text(chunks: list, field: str = "content") -> str:
    """The text a Chat Completions stream carried in ``field`` of its deltas (``content``, or
    the ``reasoning_content`` extension, which the SDK keeps as an extra attribute)."""
    return "".join(getattr(choice.delta, field, None) or "" for chunk in chunks for choice in chunk.choices)


def responses_stream_text(events: list, kind: str = "output_text") -> str:
    """The text of a Responses stream's ``response.<kind>.delta`` events (output or reasoning)."""
    return "".join(event.delta for event in events if event.type == f"response.{kind}.delta")


def anthropic_text(message) -> str:
    """The text blocks of an Anthropic message, joined."""
    return "".join(block.text for block in message.content if block.type == "text")


# -- driving the encoders without a server -------------------------------------------------------
def encode(encoder, events: list) -> list[dict]:
    """The payloads a Responses or Messages encoder writes for a stream of engine events."""
    out = encoder.start()
    for event in events:
        if isinstance(event, Finish):
            out += encoder.finish(event)
        elif isinstance(event, Error):
            out += encoder.fail(ApiError.from_event(event))
        else:
            out += encoder.delta(event)
    return out


def responses_types(events: list[dict]) -> str:
    """Responses event types without their ``response.`` prefix, space-separated."""
    return " ".join(e["type"].removeprefix("response.") for e in events)


def replay_responses(events: list[dict]) -> ResponseStreamState:
    """Responses events fed through the openai SDK's own stream state machine."""
    state = ResponseStreamState(input_tools=openai.omit, text_format=openai.omit)
    for event in events:
        state.handle_event(construct_type(type_=ResponseStreamEvent, value=event))
    return state


def anthropic_shape(events: list[dict]) -> list[str]:
    """Messages event types, with the delta kind for content_block_delta."""
    return [e["delta"]["type"] if e["type"] == "content_block_delta" else e["type"] for e in events]


def accumulate_anthropic(events: list[dict]):
    """The message the anthropic SDK's own stream accumulator builds from Messages events."""
    snapshot = None
    for event in events:
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs={})
    return snapshot
