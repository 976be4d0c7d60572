"""The Responses dialect driven by the official openai SDK against the real server."""

from __future__ import annotations

import json
import re
import signal
import threading

import httpx
import openai
import pytest

from .conftest import API_KEY, openai_client, responses_stream_text

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ASK = {"model": "m", "input": "Say hello to Bob.", "temperature": 0, "max_output_tokens": 64}


def warm(client: openai.OpenAI, **kwargs) -> openai.types.responses.Response:
    """The reply to a request answered from a warm KV slot, as the identical request after it
    will be: a reused prefix and a fresh prefill may round differently in the last float bits,
    which is the engine's business, not the dialect's."""
    client.responses.create(**kwargs)
    return client.responses.create(**kwargs)


def test_create_returns_a_completed_response(client):
    reply = client.responses.create(**ASK)
    assert reply.object == "response" and reply.id.startswith("resp_")
    assert reply.status == "completed" and reply.incomplete_details is None and reply.error is None
    (message,) = reply.output
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    assert message.content[0].type == "output_text" and reply.output_text == message.content[0].text
    assert reply.output_text.strip()
    usage = reply.usage
    assert usage.input_tokens > 10 and 0 < usage.output_tokens < 64
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0
    again = client.responses.create(**{**ASK, "max_output_tokens": 1})
    assert again.usage.input_tokens_details.cached_tokens == usage.input_tokens  # the warm slot


def test_stream_helper_yields_the_same_final_text_as_create(client):
    whole = warm(client, **ASK)
    with client.responses.stream(**ASK) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.output_text == whole.output_text and final.status == "completed"
    assert final.usage.output_tokens == whole.usage.output_tokens
    names = " ".join(e.type.removeprefix("response.") for e in events)
    assert re.fullmatch(
        r"created in_progress output_item\.added content_part\.added (output_text\.delta )+"
        r"output_text\.done content_part\.done output_item\.done completed",
        names,
    ), names
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert responses_stream_text(events) == whole.output_text
    last_delta = [e for e in events if e.type == "response.output_text.delta"][-1]
    assert last_delta.snapshot == whole.output_text  # the SDK's own accumulation
    assert len({e.response.id for e in events if hasattr(e, "response")}) == 1


def test_stream_true_matches_and_the_budget_ends_incomplete(client):
    ask = {**ASK, "max_output_tokens": 4}
    whole = warm(client, **ask)
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.output[0].status == "incomplete" and whole.usage.output_tokens == 4
    events = list(client.responses.create(stream=True, **ask))
    assert [e.type for e in events][-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    last = events[-1].response
    assert last.output_text == whole.output_text and last.incomplete_details.reason == "max_output_tokens"
    assert last.usage.output_tokens == 4


def test_instructions_and_typed_items(client):
    items = [
        {"role": "developer", "content": "Answer in one word."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi there."}]},
        {
            "type": "reasoning",
            "id": "rs_old",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "x"}],
        },
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
        {"role": "user", "content": "What color is the sky?"},
    ]

    def input_tokens(**kwargs) -> int:
        return client.responses.create(model="m", max_output_tokens=1, **kwargs).usage.input_tokens

    short = input_tokens(input=items, instructions="Be terse.")
    longer = input_tokens(input=items, instructions="Be terse, exact and polite, always.")
    assert longer > short  # the instructions reach the prompt
    without_reasoning = input_tokens(input=items[:2] + items[3:], instructions="Be terse.")
    assert without_reasoning == short  # the replayed reasoning item never does


def test_stop_extension_cuts_before_the_stop(client):
    ask = {**ASK, "max_output_tokens": 16}
    full = warm(client, **ask).output_text
    word = next(w for w in re.findall(r"[A-Za-z]{3,}", full[3:]))  # a word past the first few chars
    cut = client.responses.create(**ask, extra_body={"stop": [word]})
    assert cut.output_text == full[: full.index(word)] and cut.status == "completed"


def test_a_hosted_tool_is_left_out_and_echoed(client):
    """Codex CLI declares web_search with every request: the reply is made without it."""
    hosted = {"type": "web_search", "external_web_access": False}
    response = client.responses.create(**{**ASK, "max_output_tokens": 4}, tools=[hosted])
    assert response.status in ("completed", "incomplete") and response.tools[0].type == "web_search"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"conversation": "conv_123"}, "conversation"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}, "tool_choice.type"),
        ({"tools": [{"type": "teleport"}]}, "tools[0].type"),
        ({"reasoning": {"effort": "high"}}, "reasoning.effort"),  # the model has no reasoning channel
        (
            {
                "input": [
                    {"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}
                ]
            },
            "input[0].content[0].type",
        ),
        ({"temperature": 2.5}, "temperature"),
    ],
)
def test_rejections_are_400_naming_the_parameter(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(**{**ASK, "max_output_tokens": 4, **kwargs})
    assert err.value.status_code == 400 and err.value.param == param


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
def test_tools_on_a_model_without_a_tool_convention_are_400(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(**{**ASK, "max_output_tokens": 4, **kwargs})
    assert err.value.status_code == 400 and err.value.param == param


def test_bookkeeping_fields_are_accepted(client):
    reply = client.responses.create(
        **{**ASK, "max_output_tokens": 4},
        store=False,
        metadata={"k": "v"},
        include=["message.output_text.logprobs"],
        user="someone",
        service_tier="auto",
        parallel_tool_calls=False,
        truncation="disabled",
        reasoning={"effort": "minimal"},
        text={"format": {"type": "text"}},
        tool_choice="none",
    )
    assert reply.output_text


def test_wire_framing_and_the_unprefixed_path(http):
    body = {**ASK, "max_output_tokens": 6, "stream": True}
    with http.stream("POST", "/responses", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    frames = [f for f in raw.split("\n\n") if f]
    assert "[DONE]" not in raw
    for frame in frames:
        event_line, data_line = frame.split("\n")
        name, data = event_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
    assert http.post("/responses", json={**ASK, "max_output_tokens": 2}).json()["object"] == "response"


def test_mid_stream_failure_is_an_error_event_then_response_failed(start_server):
    server = start_server("--queue", "2")
    client = openai_client(server, api_key="none")
    stream = client.responses.create(
        model="m", input="Hi", max_output_tokens=1000, stream=True, extra_body={"ignore_eos": True}
    )
    events = iter(stream)
    while next(events).type != "response.output_text.delta":
        pass
    queued: dict = {}
    anthropic_request = threading.Thread(
        target=lambda: queued.setdefault(
            "r",
            httpx.post(
                server.url + "/v1/messages",
                json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
                timeout=120,
            ),
        )
    )
    anthropic_request.start()
    server.wait_until(lambda h: h["queued"] == 1)
    server.process.send_signal(signal.SIGTERM)
    rest = list(events)
    assert rest[-2].type == "error" and rest[-2].code == "shutting_down"
    assert rest[-1].type == "response.failed" and rest[-1].response.status == "failed"
    assert (
        rest[-1].response.error.code == "server_error" and "shutting down" in rest[-1].response.error.message
    )
    anthropic_request.join(60)
    # A queued request fails before its first event: a plain 503 in the Anthropic envelope.
    assert queued["r"].status_code == 503
    assert queued["r"].json() == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "the server is shutting down"},
    }
    assert server.process.wait(60) == 0


def test_wrong_key_is_an_authentication_error(idle_server):
    with openai_client(idle_server, api_key=API_KEY + "x") as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.responses.create(**ASK)
