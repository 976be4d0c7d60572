"""Live --spec: a speculative server answers byte-identically to a plain one.

The same requests go, in the same order, to a plain server and to a ``--spec`` server with the
same flags: a reply that copies the prompt (where drafts are accepted), a follow-up turn that
reuses the slot, an unrelated request that evicts the conversation to the disk tier and a
third turn restored from it, a stop string, a json_schema reply, a seeded sampled reply, and
(on Qwen2.5, which has a tool convention) a forced tool call and its auto follow-up. Every
reply's text, calls, finish reason and token usage (cached_tokens included) must match, and
the speculative server's log must show accepted drafts, so the comparison is not vacuous.
"""

from __future__ import annotations

import re

import httpx
import pytest

from .conftest import ASK_WEATHER, WEATHER_SCHEMA

# Live servers; serial: --spec measures its verify costs at start and, on a machine another
# test process keeps busy, rightly declines to speculate, where these tests count accepted drafts.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

LIST = "apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango"
ASK_LIST = [{"role": "user", "content": f"Repeat this list exactly: {LIST}."}]
SPEC_LOG = re.compile(r"spec: (\d+)/(\d+) accepted")
FRUITS = {
    "type": "object",
    "properties": {"fruits": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4}},
    "required": ["fruits"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather.", "parameters": WEATHER_SCHEMA},
}


def ask(http: httpx.Client, messages: list[dict], max_tokens: int = 48, **extra) -> dict:
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def outcome(reply: dict) -> tuple:
    """What a user sees of a reply: text, calls, finish reason and token usage."""
    choice, usage = reply["choices"][0], reply["usage"]
    calls = [
        (c["function"]["name"], c["function"]["arguments"]) for c in choice["message"].get("tool_calls") or []
    ]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return (
        choice["message"]["content"],
        calls,
        choice["finish_reason"],
        usage["prompt_tokens"],
        usage["completion_tokens"],
        cached,
    )


def then(messages: list[dict], reply: dict, question: str) -> list[dict]:
    return [
        *messages,
        {"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
        {"role": "user", "content": question},
    ]


def smollm2_session(server) -> list[tuple]:
    with httpx.Client(base_url=server.url, timeout=600) as http:
        first = ask(http, ASK_LIST)
        second_turn = then(ASK_LIST, first, "Now repeat the list again, the same way.")
        second = ask(http, second_turn)
        unrelated = ask(
            http, [{"role": "user", "content": "Write one sentence about the sea."}], max_tokens=16
        )
        restored = ask(http, then(second_turn, second, "Once more, please."))
        stopped = ask(http, ASK_LIST, stop=["grape"])
        schema = {"type": "json_schema", "json_schema": {"name": "fruits", "schema": FRUITS, "strict": True}}
        shaped = ask(
            http, [{"role": "user", "content": f"List some fruits from: {LIST}."}], 60, response_format=schema
        )
        sampled = ask(http, ASK_LIST, 40, temperature=0.8, seed=42, top_p=0.95)
    replies = [first, second, unrelated, restored, stopped, shaped, sampled]
    assert outcome(restored)[5] > outcome(second)[3] - 4  # the restore really reused the rows
    assert outcome(stopped)[2] == "stop" and "grape" not in outcome(stopped)[0]
    return [outcome(reply) for reply in replies]


def qwen_tools_session(server) -> list[tuple]:
    with httpx.Client(base_url=server.url, timeout=600) as http:
        forced = ask(http, ASK_WEATHER, 80, tools=[WEATHER], tool_choice="required")
        call = forced["choices"][0]["message"]["tool_calls"][0]
        history = [
            *ASK_WEATHER,
            forced["choices"][0]["message"],
            {"role": "tool", "tool_call_id": call["id"], "content": '{"temperature": 21, "sky": "sunny"}'},
        ]
        answer = ask(http, history, 40, tools=[WEATHER])
    assert outcome(forced)[2] == "tool_calls"
    return [outcome(forced), outcome(answer)]


def accepted_drafts(server) -> tuple[int, int]:
    found = [tuple(map(int, m)) for m in SPEC_LOG.findall(server.logs())]
    return sum(a for a, _ in found), sum(d for _, d in found)


def test_smollm2_spec_replies_equal_plain_through_reuse_restore_stop_schema_and_sampling(
    start_server, tmp_path
):
    flags = ["--kv-slots", "1", "--ctx", "2048", "--kv-disk-slots", "4"]
    plain = start_server(*flags, "--kv-cache-dir", str(tmp_path / "plain-kv"))
    spec = start_server(*flags, "--kv-cache-dir", str(tmp_path / "spec-kv"), "--spec")
    expected = smollm2_session(plain)
    got = smollm2_session(spec)
    for i, (want, have) in enumerate(zip(expected, got)):
        assert have == want, f"reply {i} differs"
    assert "restored a" in spec.logs() and "verify cost per row count" in spec.logs()
    accepted, drafted = accepted_drafts(spec)
    assert accepted > 20, (accepted, drafted)  # the list was copied through accepted drafts
    assert "spec:" not in plain.logs()


def test_qwen_spec_tool_calls_equal_plain(start_server):
    model = "models/qwen2.5-coder-0.5b-instruct.gguf"
    plain = start_server(model, "--ctx", "2048")
    spec = start_server(model, "--ctx", "2048", "--spec")
    assert qwen_tools_session(spec) == qwen_tools_session(plain)
    assert accepted_drafts(spec)[1] > 0  # drafts were verified (the call copies the question)
