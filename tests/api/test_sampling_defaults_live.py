"""``lmserve --temp --seed ...`` on a live server: a request that leaves a sampling field out
gets the server's value (so a client that sends no temperature, as Codex CLI does, can be made
greedy or reproducible), and a request's own value still wins."""

from __future__ import annotations

import pytest

from tests.api.conftest import openai_client

pytestmark = pytest.mark.slow

PROMPT = [{"role": "user", "content": "Write one sentence about the sea."}]


def reply(client, **fields) -> str:
    answer = client.chat.completions.create(model="any", messages=PROMPT, max_tokens=32, **fields)
    return answer.choices[0].message.content


def test_the_server_defaults_fill_what_a_request_leaves_out(start_server):
    server = start_server("--temp", "1.2", "--seed", "11")
    assert server.health()["sampling_defaults"] == {"temperature": 1.2, "seed": 11}
    with openai_client(server) as client:
        seeded = reply(client)
        assert reply(client) == seeded  # --seed: a sampled reply repeats
        greedy = reply(client, temperature=0)
        assert reply(client, temperature=0) == greedy
        assert greedy != seeded  # the request's temperature won over --temp
        assert reply(client, seed=12) != seeded  # and its seed over --seed


def test_a_greedy_server_answers_as_a_greedy_request(start_server):
    plain = start_server()
    with openai_client(plain) as client:
        asked = reply(client, temperature=0)
    plain.stop()
    greedy = start_server("--temp", "0")
    with openai_client(greedy) as client:
        assert reply(client) == asked
