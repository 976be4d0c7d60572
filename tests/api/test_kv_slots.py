"""Live KV slot reuse: follow-up turns and shared system prompts report their cached tokens.

Each dialect is exercised once: Chat (prompt_tokens_details.cached_tokens), Responses
(input_tokens_details.cached_tokens) and Anthropic (cache_read_input_tokens).
"""

from __future__ import annotations

import random

import httpx
import pytest

pytestmark = pytest.mark.slow  # a live server or a real model's long run

SLOT_FLAGS = ["--kv-slots", "2", "--ctx", "4096"]
WORDS = (
    "river stone lantern orchard copper meadow signal harbor violet thunder maple engine garden "
    "silver window compass paper falcon winter candle marble forest ladder whisper canyon echo "
    "planet ribbon saddle tunnel feather mirror beacon quartz velvet glacier market anchor"
).split()


def long_system_prompt(n_words: int = 1550, seed: int = 7) -> str:
    """About 1800 tokens of varied prose that no tokenizer merge can shorten much."""
    rng = random.Random(seed)
    sentences = []
    while sum(len(s.split()) for s in sentences) < n_words:
        words = [rng.choice(WORDS) for _ in range(rng.randint(6, 14))]
        sentences.append(" ".join(words).capitalize() + ".")
    return "You are a terse assistant. Background notes: " + " ".join(sentences)


def chat(http: httpx.Client, messages: list[dict], max_tokens: int = 8) -> dict:
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def chat_usage(reply: dict) -> tuple[int, int, int]:
    usage = reply["usage"]
    return usage["prompt_tokens"], usage["completion_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


@pytest.fixture
def slot_http(start_server):
    server = start_server(*SLOT_FLAGS)
    with httpx.Client(base_url=server.url, timeout=600) as client:
        yield client


def test_follow_up_turn_reports_the_previous_prompt_and_reply_as_cached(slot_http):
    first_messages = [{"role": "user", "content": "Name three colours of the rainbow."}]
    first = chat(slot_http, first_messages, max_tokens=12)
    prompt1, completion1, cached1 = chat_usage(first)
    assert cached1 == 0
    reply = first["choices"][0]["message"]["content"]
    follow_up = [
        *first_messages,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "More?"},
    ]
    prompt2, _, cached2 = chat_usage(chat(slot_http, follow_up))
    # the cache holds the first prompt and every reply token but the last, which was never fed back
    assert cached2 >= prompt1 + completion1 - 2
    assert cached2 < prompt2


def test_shared_system_prompt_is_copied_and_the_first_conversation_stays_warm(slot_http):
    system = long_system_prompt()
    conv_a = [{"role": "system", "content": system}, {"role": "user", "content": "Summarize the notes."}]
    first_a = chat(slot_http, conv_a)
    prompt_a, completion_a, _ = chat_usage(first_a)
    assert 1500 <= prompt_a <= 2300

    body_b = {
        "model": "m",
        "system": system,
        "max_tokens": 8,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Which word comes up most often?"}],
    }
    response_b = slot_http.post("/v1/messages", json=body_b)
    assert response_b.status_code == 200, response_b.text
    usage_b = response_b.json()["usage"]
    system_tokens = prompt_a - 12  # the user turn and the template's framing are a handful of tokens
    assert usage_b["cache_read_input_tokens"] >= 0.9 * system_tokens

    reply_a = first_a["choices"][0]["message"]["content"]
    body_a2 = {
        "model": "m",
        "instructions": system,
        "max_output_tokens": 8,
        "temperature": 0,
        "input": [
            {"role": "user", "content": "Summarize the notes."},
            {"role": "assistant", "content": reply_a},
            {"role": "user", "content": "Shorter, please."},
        ],
    }
    response_a2 = slot_http.post("/v1/responses", json=body_a2)
    assert response_a2.status_code == 200, response_a2.text
    usage_a2 = response_a2.json()["usage"]
    assert usage_a2["input_tokens_details"]["cached_tokens"] >= prompt_a + completion_a - 2
