"""Where the dialects must agree with their published APIs, driven through the real SDKs on the
shared server (SmolLM2, a model without a tool convention or a reasoning channel): tool
messages a model cannot honour are refused by name, a Responses object echoes the requested
``text.format``, and an Anthropic assistant prefill is continued, not refused."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from .conftest import anthropic_client, anthropic_text

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

GREEDY = {"temperature": 0}
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}


@pytest.fixture
def claude(idle_server):
    with anthropic_client(idle_server, timeout=300) as c:
        yield c


def test_chat_tool_messages_need_a_tool_convention(client):
    messages = [
        {"role": "user", "content": "What is the weather?"},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=messages, max_tokens=4)
    error = err.value.body
    assert error["param"] == "messages[1].role" and "function-calling" in error["message"]
    assert err.value.code == "unsupported_parameter"


@pytest.mark.parametrize("stream", [False, True])
def test_responses_echo_the_requested_text_format(client, stream):
    text_format = {"type": "json_schema", "name": "verdict", "schema": ANSWER_SCHEMA, "strict": True}
    fields = {
        "model": "m",
        "input": "Is water wet?",
        "max_output_tokens": 16,
        "text": {"format": text_format},
    }
    if stream:
        events = list(client.responses.create(**fields, stream=True))
        echoed = [event.response.text.format for event in events if hasattr(event, "response")]
        assert len(echoed) == 3  # created, in_progress, completed
        response = events[-1].response
    else:
        response = client.responses.create(**fields)
        echoed = [response.text.format]
    for text in echoed:
        assert (text.type, text.name, text.schema_, text.strict) == (
            "json_schema",
            "verdict",
            ANSWER_SCHEMA,
            True,
        )
    assert json.loads(response.output_text)["answer"] in ("yes", "no")
    plain = client.responses.create(model="m", input="Hi", max_output_tokens=2)
    assert plain.text.format.type == "text"


HELLO = [{"role": "user", "content": "Say hello to Bob."}]


def test_anthropic_prefill_is_continued(claude):
    # The greedy reply without a prefill, then its first word as the prefill: the model goes on
    # exactly as it did, and the reply holds only the continuation.
    whole = anthropic_text(
        claude.messages.create(model="m", max_tokens=24, messages=HELLO, extra_body=GREEDY)
    )
    head = whole.split(" ")[0]
    assert head and head != whole, whole
    prefill = [*HELLO, {"role": "assistant", "content": head}]
    reply = claude.messages.create(model="m", max_tokens=8, messages=prefill, extra_body=GREEDY)
    continuation = anthropic_text(reply)
    assert continuation and whole.startswith(head + continuation), (whole, continuation)
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 8
    with claude.messages.stream(model="m", max_tokens=8, messages=prefill, extra_body=GREEDY) as stream:
        assert stream.get_final_message().content[0].text == continuation
    counted = claude.messages.count_tokens(model="m", messages=prefill).input_tokens
    assert counted > claude.messages.count_tokens(model="m", messages=HELLO).input_tokens


def test_anthropic_prefill_with_trailing_whitespace_is_400(claude):
    prefill = [*HELLO, {"role": "assistant", "content": "Hello "}]
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(model="m", max_tokens=8, messages=prefill)
    assert "trailing whitespace" in err.value.body["error"]["message"]
