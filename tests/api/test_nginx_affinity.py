"""Two replicas on loopback behind nginx (Debian's package), configured as docs/SCALING.md
shows (bench/affinity.py writes the configuration): a conversation's turns reach the replica
holding its KV rows, and a 429 with its Retry-After passes through the balancer."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from bench.affinity import free_port, nginx_config

from .conftest import start_lmserve

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NGINX = "/usr/sbin/nginx"
CHAT = "/v1/chat/completions"


@pytest.fixture
def balanced(tmp_path):
    """Two replicas (one-deep queues) and nginx; yields (affinity URL, replicas)."""
    if not Path(NGINX).exists():
        pytest.fail(f"no nginx at {NGINX}: run scripts/test.py (it installs Debian's nginx)")
    replicas, nginx = [], None
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            replicas.append(start_lmserve(tmp_path / name, "--ctx", "1024", "--queue", "1"))
        port = free_port()
        config = nginx_config(tmp_path, [r.url.removeprefix("http://") for r in replicas], port, free_port())
        nginx = subprocess.Popen([NGINX, "-p", str(tmp_path), "-c", str(config)])
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.1)
        yield url, replicas
    finally:
        if nginx is not None:
            nginx.terminate()
            nginx.wait(10)
        for replica in replicas:
            replica.stop()


def chat(url: str, conversation: str, messages: list, **extra) -> httpx.Response:
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, **extra}
    headers = {"x-lmserve-conversation": conversation}
    return httpx.post(url + CHAT, json=body, headers=headers, timeout=120)


def generated(replicas) -> list[int]:
    return [r.health()["tokens_generated"] for r in replicas]


def test_a_conversation_returns_to_the_replica_holding_its_rows(balanced):
    url, replicas = balanced
    for conversation in ("alpha", "beta", "gamma"):
        before = generated(replicas)
        messages = [{"role": "user", "content": f"Tell me about {conversation} particles in detail."}]
        first = chat(url, conversation, messages)
        assert first.status_code == 200, first.text
        messages += [first.json()["choices"][0]["message"], {"role": "user", "content": "And then?"}]
        second = chat(url, conversation, messages)
        assert second.status_code == 200, second.text
        assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        moved = [after - b for after, b in zip(generated(replicas), before, strict=True)]
        assert sorted(moved)[0] == 0 and sorted(moved)[1] > 0, f"{conversation} was served by both: {moved}"


def test_429_and_retry_after_pass_through(balanced):
    url, replicas = balanced
    long = {"ignore_eos": True, "max_tokens": 400, "stream": True}
    messages = [{"role": "user", "content": "Count."}]
    clients = [httpx.Client(timeout=120) for _ in range(2)]
    streams = []

    def open_stream(client):
        body = {"messages": messages, **long}
        headers = {"x-lmserve-conversation": "busy"}
        request = client.build_request("POST", url + CHAT, json=body, headers=headers)
        streams.append(client.send(request, stream=True))

    waiter = threading.Thread(target=open_stream, args=(clients[1],))
    try:
        open_stream(clients[0])
        busy = next(r for r in replicas if r.wait_until(lambda h: True)["in_flight"] == 1)
        waiter.start()
        busy.wait_until(lambda h: h["queued"] == 1)
        refused = chat(url, "busy", messages)
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "queue_full"
    finally:
        if waiter.ident is not None:
            waiter.join(30)
        for stream in streams:
            stream.close()
        for client in clients:
            client.close()
    for replica in replicas:
        replica.wait_idle()
