"""GET /metrics against a live server: scraped before and after real requests, parsed with
prometheus_client's own parser, and every counter checked to have moved by what the requests
did (requests by endpoint and status, 429s, tokens, first-token and decode-rate histograms,
KV slot hits, queue depth and in-flight while a request waits)."""

from __future__ import annotations

import threading

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import API_KEY

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
AUTH = {"authorization": f"Bearer {API_KEY}"}


def scrape(server, headers: dict | None = None) -> dict[tuple, float]:
    """Every sample of /metrics as {(name, sorted label items): value}."""
    reply = httpx.get(server.url + "/metrics", headers=headers or {}, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def chat(server, messages: list, **extra) -> httpx.Response:
    body = {"model": "m", "messages": messages, "max_tokens": 8, "temperature": 0, **extra}
    return httpx.post(server.url + CHAT, json=body, headers=AUTH, timeout=120)


@pytest.fixture(scope="module")
def metered(tmp_path_factory):
    from .conftest import start_lmserve

    server = start_lmserve(
        tmp_path_factory.mktemp("metrics"),
        "--api-key",
        API_KEY,
        "--queue",
        "1",
        "--ctx",
        "512",
        "--kv-slots",
        "2",
    )
    yield server
    server.stop()


def test_counters_move_with_requests(metered):
    before = scrape(metered)  # no key needed: --metrics open is the default
    first = chat(metered, [{"role": "user", "content": "Name a colour."}])
    assert first.status_code == 200, first.text
    turn = [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]},
        {"role": "user", "content": "And another one?"},
    ]
    second = chat(metered, turn, stream=True, stream_options={"include_usage": True})
    assert second.status_code == 200
    bad = httpx.post(metered.url + CHAT, json={"messages": "nope"}, headers=AUTH, timeout=30)
    assert bad.status_code == 400
    assert httpx.get(metered.url + "/v1/models", timeout=30).status_code == 401
    assert httpx.get(metered.url + "/no/such/path", headers=AUTH, timeout=30).status_code == 404
    after = scrape(metered)

    def moved(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("lmserve_http_requests_total", endpoint=CHAT, status="200") == 2
    assert moved("lmserve_http_requests_total", endpoint=CHAT, status="400") == 1
    assert moved("lmserve_http_requests_total", endpoint="/v1/models", status="401") == 1
    assert moved("lmserve_http_requests_total", endpoint="other", status="404") == 1
    usage1, usage2 = first.json()["usage"], _stream_usage(second.text)
    assert (
        moved("lmserve_prompt_tokens_total", endpoint=CHAT)
        == usage1["prompt_tokens"] + usage2["prompt_tokens"]
    )
    generated = usage1["completion_tokens"] + usage2["completion_tokens"]
    assert moved("lmserve_generated_tokens_total", endpoint=CHAT) == generated
    cached = usage2["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0, "the follow-up turn should reuse the first turn's KV rows"
    assert moved("lmserve_cached_prompt_tokens_total", endpoint=CHAT) == cached
    assert moved("lmserve_kv_hits_total", tier="resident") >= 1
    assert moved("lmserve_time_to_first_token_seconds_count", endpoint=CHAT) == 2
    assert moved("lmserve_time_to_first_token_seconds_sum", endpoint=CHAT) > 0
    assert moved("lmserve_decode_tokens_per_second_count", endpoint=CHAT) == 2
    assert value(after, "lmserve_ready") == 1
    assert value(after, "lmserve_kv_slots") == 2
    assert value(after, "lmserve_queue_capacity") == 1


def _stream_usage(text: str) -> dict:
    import json

    frames = [line[6:] for line in text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]
    return next(json.loads(f)["usage"] for f in reversed(frames) if json.loads(f).get("usage"))


def test_queue_gauges_and_429s(metered):
    metered.wait_idle()
    before = scrape(metered)
    long_body = {"messages": [{"role": "user", "content": "Count."}], "max_tokens": 400, "ignore_eos": True}
    clients = [httpx.Client(base_url=metered.url, headers=AUTH, timeout=120) for _ in range(2)]
    streams = []
    waiter = threading.Thread(target=lambda: open_stream(clients[1]))

    def open_stream(client):
        # Streams, so closing the response hangs up and frees the worker.
        request = client.build_request("POST", CHAT, json={**long_body, "stream": True})
        streams.append(client.send(request, stream=True))

    try:
        open_stream(clients[0])
        metered.wait_until(lambda h: h["in_flight"] == 1)
        waiter.start()
        metered.wait_until(lambda h: h["queued"] == 1)
        busy = scrape(metered)
        assert value(busy, "lmserve_queue_depth") == 1
        assert value(busy, "lmserve_in_flight") == 1
        refused = chat(metered, [{"role": "user", "content": "Hi"}])
        assert refused.status_code == 429
    finally:
        if waiter.is_alive() or waiter.ident is not None:
            waiter.join(30)  # its stream opens after --stream-start-after
        for stream in streams:
            stream.close()  # a hang-up: the server cancels the work
        for client in clients:
            client.close()
    metered.wait_idle()
    after = scrape(metered)
    assert value(after, "lmserve_queue_full_total") - value(before, "lmserve_queue_full_total") == 1
    refusals = value(after, "lmserve_http_requests_total", endpoint=CHAT, status="429")
    assert refusals - value(before, "lmserve_http_requests_total", endpoint=CHAT, status="429") == 1
    assert value(after, "lmserve_queue_depth") == 0 and value(after, "lmserve_in_flight") == 0


def test_metrics_behind_the_key(start_server):
    server = start_server("--api-key", API_KEY, "--ctx", "256", "--metrics", "key")
    refused = httpx.get(server.url + "/metrics", timeout=30)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert value(scrape(server, AUTH), "lmserve_ready") == 1
