"""The Anthropic Messages dialect driven by the official anthropic SDK against the real server.

This SDK generation has no sampling arguments on ``messages.create``; temperature goes in
``extra_body``, as any extra field does."""

from __future__ import annotations

import re
import signal
import threading

import anthropic
import httpx
import pytest

from .conftest import API_KEY, anthropic_client, anthropic_text
from .rawhttp import RawRequest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HELLO = [{"role": "user", "content": "Say hello to Bob."}]
GREEDY = {"temperature": 0}


@pytest.fixture
def claude(idle_server):
    with anthropic_client(idle_server, timeout=300) as c:
        yield c


def ask(**kwargs) -> dict:
    return {"model": "m", "max_tokens": 64, "messages": HELLO, "extra_body": GREEDY, **kwargs}


def warm(claude, **kwargs):
    """The reply to a request answered from a warm KV slot, as the identical request after it
    will be (a reused prefix and a fresh prefill may round differently in the last bits)."""
    claude.messages.create(**kwargs)
    return claude.messages.create(**kwargs)


def test_create_returns_a_message(claude):
    reply = claude.messages.create(**ask())
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert [block.type for block in reply.content] == ["text"] and anthropic_text(reply).strip()
    assert reply.stop_reason == "end_turn" and reply.stop_sequence is None
    assert reply.model.startswith("SmolLM2-135M-Instruct")
    usage = reply.usage
    assert 0 < usage.output_tokens < 64 and usage.cache_creation_input_tokens == 0
    counted = claude.messages.count_tokens(model="m", messages=HELLO).input_tokens
    assert usage.input_tokens + usage.cache_read_input_tokens == counted > 5
    again = claude.messages.create(**ask(max_tokens=1))
    assert (again.usage.input_tokens, again.usage.cache_read_input_tokens) == (0, counted)  # warm slot


def test_stream_helper_final_message_equals_create(claude):
    whole = warm(claude, **ask())
    with claude.messages.stream(**ask()) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert anthropic_text(final) == anthropic_text(whole) and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.cache_read_input_tokens == whole.usage.cache_read_input_tokens
    raw = [e.type for e in events if e.type != "text"]  # "text" is the helper's own convenience event
    assert raw[:2] == ["message_start", "content_block_start"]
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(raw[2:-3]) == {"content_block_delta"}
    start = events[0].message
    assert start.content == [] and start.usage.input_tokens == start.usage.output_tokens == 0
    assert "".join(e.text for e in events if e.type == "text") == anthropic_text(whole)


def test_count_tokens_counts_system_and_thinking_is_a_no_op(claude):
    def count(system: str) -> int:
        blocks = [{"type": "text", "text": system}]
        return claude.messages.count_tokens(model="m", messages=HELLO, system=blocks).input_tokens

    assert count("You are a helpful pirate who loves the sea.") > count("You are a pirate.")
    plain = warm(claude, **ask(max_tokens=8))
    thinking = claude.messages.create(
        **ask(max_tokens=8, thinking={"type": "enabled", "budget_tokens": 1024})
    )
    assert [b.type for b in thinking.content] == ["text"]
    assert anthropic_text(thinking) == anthropic_text(plain)


def test_history_with_thinking_blocks_and_system_blocks(claude):
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Hi there."}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "The user greets me.", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Hello!"},
            ],
        },
        {"role": "user", "content": "What color is the sky?"},
    ]
    reply = claude.messages.create(**ask(messages=messages, system="Be brief.", max_tokens=8))
    assert anthropic_text(reply)
    without_thinking = [messages[0], {"role": "assistant", "content": "Hello!"}, messages[2]]
    counts = [
        claude.messages.count_tokens(model="m", messages=m, system="Be brief.").input_tokens
        for m in (messages, without_thinking)
    ]
    assert counts[0] == counts[1]  # the thinking blocks never reach the prompt


def test_stop_sequences_are_attributed(claude):
    full = anthropic_text(warm(claude, **ask(max_tokens=16)))
    word = next(w for w in re.findall(r"[A-Za-z]{3,}", full[3:]))
    expected = full[: full.index(word)]
    cut = claude.messages.create(**ask(max_tokens=16, stop_sequences=["zzzz", word]))
    assert anthropic_text(cut) == expected
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == word
    with claude.messages.stream(**ask(max_tokens=16, stop_sequences=["zzzz", word])) as stream:
        pieces = [e.text for e in stream if e.type == "text"]
        final = stream.get_final_message()
    assert "".join(pieces) == expected and word not in "".join(pieces)
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == word


def test_max_tokens_stop(claude):
    reply = claude.messages.create(**ask(max_tokens=3))
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 3
    with claude.messages.stream(**ask(max_tokens=3)) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 3


def expect_error(error_class, call) -> dict:
    """Run ``call``; it must raise ``error_class`` with an Anthropic error envelope as its body."""
    with pytest.raises(error_class) as err:
        call()
    body = err.value.body
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return body["error"]


def test_400_errors(claude):
    missing = expect_error(
        anthropic.BadRequestError,
        lambda: claude.post(
            "/v1/messages", body={"model": "m", "messages": HELLO}, cast_to=anthropic.types.Message
        ),
    )
    assert missing["type"] == "invalid_request_error" and "max_tokens" in missing["message"]
    image = [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]
    refused = expect_error(
        anthropic.BadRequestError,
        lambda: claude.messages.create(**ask(messages=[{"role": "user", "content": image}])),
    )
    assert "messages[0].content[0].type" in refused["message"]
    server_tool = [{"type": "web_search_20250305", "name": "web_search"}]
    expect_error(anthropic.BadRequestError, lambda: claude.messages.create(**ask(tools=server_tool)))
    expect_error(
        anthropic.BadRequestError, lambda: claude.messages.create(**ask(extra_body={"temperature": 1.5}))
    )


def test_tools_are_dropped_on_a_model_without_a_tool_convention(claude):
    tools = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}]
    reply = claude.messages.create(**ask(tools=tools, tool_choice={"type": "any"}, max_tokens=2))
    assert reply.stop_reason in ("max_tokens", "end_turn") and [b.type for b in reply.content] == ["text"]


def test_401_with_either_header(idle_server):
    with anthropic_client(idle_server, api_key="wrong") as bad:
        error = expect_error(anthropic.AuthenticationError, lambda: bad.messages.create(**ask(max_tokens=2)))
    assert error["type"] == "authentication_error"
    body = {"model": "m", "max_tokens": 2, "messages": HELLO}
    for headers, status in (
        ({"x-api-key": API_KEY}, 200),
        ({"authorization": f"Bearer {API_KEY}"}, 200),
        ({"x-api-key": "wrong"}, 401),
        ({}, 401),
    ):
        r = httpx.post(idle_server.url + "/v1/messages", json=body, headers=headers, timeout=120)
        assert r.status_code == status, headers
    assert r.json()["error"]["type"] == "authentication_error"


def test_404_for_a_wrong_base_url(idle_server):
    with anthropic.Anthropic(base_url=idle_server.url + "/nope", api_key=API_KEY, max_retries=0) as lost:
        error = expect_error(anthropic.NotFoundError, lambda: lost.messages.create(**ask(max_tokens=2)))
    assert error["type"] == "not_found_error"


def test_429_when_the_queue_is_full(claude, idle_server):
    endless = {"model": "m", "max_tokens": 1000, "messages": HELLO, "stream": True, "ignore_eos": True}
    busy = RawRequest(idle_server.url, "/v1/messages", endless, {"x-api-key": API_KEY})
    queued: dict = {}
    try:
        busy.read_until(lambda got: b"content_block_delta" in got)  # generating: the queue (depth 1) is empty
        waiting = threading.Thread(
            target=lambda: queued.setdefault("r", claude.messages.create(**ask(max_tokens=2)))
        )
        waiting.start()
        idle_server.wait_until(lambda h: h["queued"] == 1)
        error = expect_error(anthropic.RateLimitError, lambda: claude.messages.create(**ask(max_tokens=2)))
        assert error["type"] == "rate_limit_error"
    finally:
        busy.close()
    waiting.join(120)
    assert queued["r"].usage.output_tokens <= 2  # the queued request ran once the stream was dropped


def test_unprefixed_paths(http):
    body = {"model": "m", "max_tokens": 2, "messages": HELLO}
    assert http.post("/messages", json=body).json()["type"] == "message"
    assert (
        http.post("/messages/count_tokens", json={"model": "m", "messages": HELLO}).json()["input_tokens"] > 5
    )


def test_mid_stream_failure_is_an_error_event(start_server):
    server = start_server()
    client = anthropic_client(server, api_key="none")
    with client.messages.stream(**ask(max_tokens=1000, extra_body={"ignore_eos": True})) as stream:
        events = iter(stream)
        while next(events).type != "text":
            pass
        server.process.send_signal(signal.SIGTERM)
        with pytest.raises(anthropic.APIStatusError) as err:
            for _ in events:
                pass
    assert err.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "the server is shutting down"},
    }
    assert server.process.wait(60) == 0
