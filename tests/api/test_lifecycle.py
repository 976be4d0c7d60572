"""Servers with their own flags: the --conns cap, SIGTERM drain, runserver, --help."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from .conftest import POLL, ROOT, ServerProcess, openai_client
from .rawhttp import RawRequest, count_frames

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HI = [{"role": "user", "content": "Hi"}]
ENDLESS = {"messages": HI, "max_tokens": 1000, "stream": True, "ignore_eos": True}


def test_help_lists_every_flag_with_its_default():
    out = subprocess.run(
        [sys.executable, "manage.py", "lmserve", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    options = " ".join(out.split("options:", 1)[1].split())
    for flag, default in (
        ("--host", "127.0.0.1"),
        ("--port", "8080"),
        ("--ctx", "4096"),
        ("--queue", "16"),
        ("--conns", "64"),
        ("--kv-slots", "1"),
        ("--api-key", "$LMSERVE_API_KEY, else no key"),
    ):
        help_text = options.split(f"{flag} ", 1)[1].split(" --", 1)[0]
        assert f"(default: {default})" in help_text, (flag, help_text)


def test_conns_caps_requests_served_at_once(start_server):
    server = start_server("--conns", "2", "--queue", "4")
    running = RawRequest(server.url, "/v1/chat/completions", ENDLESS)
    waiting = RawRequest(server.url, "/v1/chat/completions", ENDLESS)
    try:
        running.read_until(lambda got: count_frames(got) >= 1)
        server.wait_until(lambda h: h["queued"] == 1 and h["connections"] == 2)
        r = httpx.get(server.url + "/v1/models")
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "too_many_connections" and r.headers["retry-after"]
        assert httpx.get(server.url + "/health").status_code == 200  # probes are never capped
    finally:
        running.close()
        waiting.close()
    server.wait_until(lambda h: h["connections"] == 0 and h["in_flight"] == 0)
    assert httpx.get(server.url + "/v1/models").status_code == 200


def test_sigterm_drains_and_exits_zero(start_server):
    server = start_server("--queue", "2")
    client = openai_client(server, api_key="none")
    outcome: dict = {}

    def queued_request():
        try:
            client.chat.completions.create(model="m", messages=HI, max_tokens=4)
        except openai.APIStatusError as exc:
            outcome["queued"] = exc

    stream = client.chat.completions.create(
        model="m", messages=HI, max_tokens=1000, stream=True, extra_body={"ignore_eos": True}
    )
    chunks = iter(stream)
    next(chunks)  # generating
    thread = threading.Thread(target=queued_request)
    thread.start()
    server.wait_until(lambda h: h["queued"] == 1)

    server.process.send_signal(signal.SIGTERM)
    with pytest.raises(openai.APIError, match="shutting down"):
        for _ in chunks:  # the in-flight stream ends with an in-band error frame
            pass
    thread.join(60)
    assert outcome["queued"].status_code == 503 and outcome["queued"].code == "shutting_down"
    assert server.process.wait(60) == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health")
    assert "draining" in server.logs()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_runserver_serves_the_default_model(tmp_path):
    """Started as a background job is (SIGINT ignored, inherited), it still stops on SIGINT."""
    port = free_port()
    args = ["runserver", f"127.0.0.1:{port}", "--noreload"]
    proc = ServerProcess(args, tmp_path, announce="Starting ASGI", sigint_ignored=True)
    try:
        proc.wait_listening(timeout=120)
        proc.url = f"http://127.0.0.1:{port}"
        first = None
        while first is None:
            try:
                first = httpx.get(proc.url + "/health", timeout=10)
            except httpx.TransportError:
                time.sleep(POLL)  # the announcement comes just before the socket listens
        assert first.status_code == 503 and first.json()["status"] == "loading"  # the first request starts it
        proc.wait_ready()
        with openai_client(proc, api_key="none") as client:
            assert client.models.list().data[0].id.startswith("SmolLM2-135M-Instruct")
            reply = client.chat.completions.create(model="m", messages=HI, max_tokens=4)
            assert reply.choices[0].message.content
        assert httpx.get(proc.url + "/admin/login/").status_code == 200  # Django still serves its pages
        assert proc.stop(signal.SIGINT) == 0
    finally:
        proc.stop()
