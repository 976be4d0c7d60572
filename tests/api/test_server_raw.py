"""The server at the HTTP level: status codes, error bodies, queue limits, slow and vanishing
clients. Runs after the SDK tests on the same shared server and ends by checking it is still
healthy."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from .conftest import API_KEY
from .rawhttp import RawRequest, count_frames

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

AUTH = {"Authorization": f"Bearer {API_KEY}"}
HI = [{"role": "user", "content": "Hi"}]


def endless(max_tokens: int = 1000, **extra) -> dict:
    """A streamed request that keeps the worker busy until it is cancelled."""
    return {"messages": HI, "max_tokens": max_tokens, "stream": True, "ignore_eos": True, **extra}


def test_unknown_paths_and_wrong_methods_are_json_errors(http):
    for path in ("/nope", "/v1/nope", "/v1/chat/completion"):
        r = http.get(path)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    for method, path in (("GET", "/v1/chat/completions"), ("POST", "/v1/models"), ("DELETE", "/health")):
        r = http.request(method, path)
        assert r.status_code == 405, path
        assert r.json()["error"]["code"] == "method_not_allowed"
        assert method not in r.headers["allow"]


def test_every_endpoint_answers_with_and_without_v1(http):
    model_id = http.get("/v1/models").json()["data"][0]["id"]
    for prefix in ("/v1", ""):
        assert http.get(f"{prefix}/models").json()["data"][0]["id"] == model_id
        assert http.get(f"{prefix}/models/{model_id}").json()["id"] == model_id
        r = http.post(f"{prefix}/chat/completions", json={"messages": HI, "max_tokens": 2})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 2
    health = http.get("/health").json()
    assert health["status"] == "ok" and health["kv_reuse"] is True  # llama reuses slot rows


def test_api_key_guards_v1_but_not_health(idle_server):
    url = idle_server.url
    for path in ("/v1/models", "/models", f"/v1/models/{idle_server.health()['model']}"):
        r = httpx.get(url + path)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(
        url + "/v1/chat/completions", json={"messages": HI}, headers={"Authorization": "Bearer nope"}
    )
    assert r.status_code == 401
    assert httpx.get(url + "/v1/models", headers={"x-api-key": API_KEY}).status_code == 200
    assert httpx.get(url + "/health").status_code == 200


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{", None),
        (b"", None),
        (b"[]", None),
        (b"null", None),
        (b"\xff\xfe{}", None),
        (b'{"messages": "hello"}', "messages"),
        (b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', "temperature"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}', "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "x"}], "stream": 1}', "stream"),
        (b'{"messages": [{"role": "user", "content": "x"}], "top_p": NaN}', "top_p"),
        (b'{"messages": [{"role": "user", "content": "x"}], "seed": 1.5}', "seed"),
        (b'{"messages": [{"role": [], "content": "hi"}]}', "messages[0].role"),
        (b'{"messages": [{"role": {"a": 1}, "content": "hi"}]}', "messages[0].role"),
        (
            b'{"messages": [{"role": "user", "content": [{"type": [], "text": "x"}]}]}',
            "messages[0].content[0].type",
        ),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "temperature": 1' + b"0" * 400 + b"}",
            "temperature",
        ),
    ],
)
def test_malformed_json_and_wrong_types_are_400(http, body, param):
    r = http.post("/v1/chat/completions", content=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    if param:
        assert param in error["message"]


def test_early_stream_failure_is_a_plain_json_error(http):
    r = http.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "word " * 1500}], "stream": True},
    )
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_oversized_bodies_are_413(http):
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * (9 * 1024 * 1024) + b'"}]}'
    r = http.post("/v1/chat/completions", content=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    # Without a Content-Length (chunked upload) the limit applies as the chunks arrive.
    r = http.post(
        "/v1/chat/completions", content=iter([big[i : i + 65536] for i in range(0, len(big), 65536)])
    )
    assert r.status_code == 413


def test_full_queue_is_429_with_retry_after(idle_server):
    busy = RawRequest(idle_server.url, "/v1/chat/completions", endless(), AUTH)
    try:
        busy.read_until(lambda got: count_frames(got) >= 1)  # generating: the queue (depth 1) is empty
        waiting: dict = {}
        queued = threading.Thread(
            target=lambda: waiting.setdefault(
                "r",
                httpx.post(
                    idle_server.url + "/v1/chat/completions",
                    json={"messages": HI, "max_tokens": 2},
                    headers=AUTH,
                    timeout=120,
                ),
            )
        )
        queued.start()
        idle_server.wait_until(lambda h: h["queued"] == 1)
        r = httpx.post(idle_server.url + "/v1/chat/completions", json={"messages": HI}, headers=AUTH)
        assert r.status_code == 429
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error"
    finally:
        busy.close()
    queued.join(120)
    assert waiting["r"].status_code == 200  # the queued request ran once the stream was dropped


def test_client_that_reads_nothing_slows_nobody(idle_server):
    n_tokens = 96
    before = idle_server.health()["tokens_generated"]
    silent = RawRequest(
        idle_server.url,
        "/v1/chat/completions",
        endless(n_tokens, stream_options={"include_usage": True}),
        AUTH,
        rcvbuf=4096,
    )
    try:
        idle_server.wait_until(lambda h: h["in_flight"] == 1)
        sibling = httpx.post(
            idle_server.url + "/v1/chat/completions",
            json={"messages": HI, "max_tokens": 4},
            headers=AUTH,
            timeout=120,
        )
        assert sibling.status_code == 200
        # One worker: the sibling ran after the silent stream had generated all of its tokens.
        health = idle_server.wait_idle()
        assert health["tokens_generated"] - before >= n_tokens + 1
        assert silent.received == b""
        silent.read_all()
    finally:
        silent.close()
    frames = silent.frames()
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == n_tokens
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_disconnect_stops_generation_at_once(idle_server):
    before = idle_server.health()["tokens_generated"]
    stream = RawRequest(idle_server.url, "/v1/chat/completions", endless(), AUTH)
    stream.read_until(lambda got: count_frames(got) >= 3)
    read = count_frames(stream.received)
    stream.close()
    health = idle_server.wait_idle(timeout=30)
    generated = health["tokens_generated"] - before
    # The frames read, those already in flight to the socket, and a token or two after the close.
    assert generated <= read + 6, f"{generated} tokens generated after reading {read} frames"


def test_disconnect_cancels_a_queued_job(idle_server):
    busy = RawRequest(idle_server.url, "/v1/chat/completions", endless(), AUTH)
    try:
        busy.read_until(lambda got: count_frames(got) >= 1)
        waiting = RawRequest(idle_server.url, "/v1/chat/completions", endless(), AUTH)
        idle_server.wait_until(lambda h: h["queued"] == 1)
        waiting.close()
        health = idle_server.wait_until(lambda h: h["queued"] == 0)
        assert health["in_flight"] == 1  # the stream still runs; the queued job is simply gone
    finally:
        busy.close()
    idle_server.wait_idle(timeout=30)


def test_server_is_still_healthy_after_all_of_it(http, idle_server):
    health = idle_server.health()
    assert health["status"] == "ok" and health["connections"] == 0
    r = http.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
