"""The Chat Completions dialect driven by the official openai SDK against the real server."""

from __future__ import annotations

import openai
import pytest

from .conftest import API_KEY, chat_stream_text, openai_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FRANCE = [{"role": "user", "content": "Name the capital city of France."}]


def stream_text(client, **kwargs) -> tuple[str, list]:
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    return chat_stream_text(chunks), chunks


def test_models_list_and_retrieve(client):
    models = client.models.list().data
    assert len(models) == 1
    model_id = models[0].id
    assert model_id.startswith("SmolLM2-135M-Instruct")
    assert client.models.retrieve(model_id).id == model_id
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("no-such-model")
    assert err.value.code == "model_not_found"


def test_non_streamed_completion(client):
    reply = client.chat.completions.create(model="ignored", messages=FRANCE, temperature=0, max_tokens=24)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant"
    assert "Paris" in choice.message.content
    assert choice.finish_reason == "stop"
    usage = reply.usage
    assert usage.prompt_tokens > 10 and 0 < usage.completion_tokens <= 24
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens >= 0


def test_streamed_text_equals_the_non_streamed_reply(client):
    messages = [{"role": "system", "content": "You are terse."}, *FRANCE]
    whole = client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=24)
    text, chunks = stream_text(client, model="m", messages=messages, temperature=0, max_tokens=24)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and not any(finishes[:-1])
    assert chunks[-1].usage is None  # no usage chunk unless asked for


def test_max_tokens_ends_with_length(client):
    reply = client.chat.completions.create(model="m", messages=FRANCE, temperature=0, max_tokens=3)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 3
    new_name = client.chat.completions.create(
        model="m", messages=FRANCE, temperature=0, max_completion_tokens=2
    )
    assert new_name.choices[0].finish_reason == "length" and new_name.usage.completion_tokens == 2
    _, chunks = stream_text(client, model="m", messages=FRANCE, temperature=0, max_tokens=3)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_stop_strings_cut_the_reply_before_the_stop(client):
    full = client.chat.completions.create(model="m", messages=FRANCE, temperature=0, max_tokens=24)
    text = full.choices[0].message.content
    assert "Paris" in text
    for stop in (["Paris"], ["of Fr", "zzz"]):
        expected = text[: min(text.index(s) for s in stop if s in text)]
        cut = client.chat.completions.create(
            model="m", messages=FRANCE, temperature=0, max_tokens=24, stop=stop
        )
        assert cut.choices[0].message.content == expected
        assert cut.choices[0].finish_reason == "stop"
        streamed, chunks = stream_text(
            client, model="m", messages=FRANCE, temperature=0, max_tokens=24, stop=stop
        )
        assert streamed == expected
        assert not any(s in (c.choices[0].delta.content or "") for c in chunks if c.choices for s in stop)


def test_same_seed_reproduces_the_reply(client):
    ask = dict(
        model="m",
        messages=[{"role": "user", "content": "Tell me a one-line joke."}],
        temperature=1.2,
        top_p=1.0,
        max_tokens=16,
    )
    first = client.chat.completions.create(seed=1234, **ask).choices[0].message.content
    again = client.chat.completions.create(seed=1234, **ask).choices[0].message.content
    streamed, _ = stream_text(client, seed=1234, **ask)
    assert first == again == streamed
    others = {client.chat.completions.create(seed=s, **ask).choices[0].message.content for s in (1, 2, 3)}
    assert len(others | {first}) > 1, "different seeds should sample different replies"


def test_include_usage_adds_a_final_usage_chunk(client):
    whole = client.chat.completions.create(model="m", messages=FRANCE, temperature=0, max_tokens=8)
    _, chunks = stream_text(
        client,
        model="m",
        messages=FRANCE,
        temperature=0,
        max_tokens=8,
        stream_options={"include_usage": True},
    )
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    # The same prompt again: the resident KV slot (with the logits saved after its prefill) serves all of it.
    assert last.usage.prompt_tokens_details.cached_tokens == last.usage.prompt_tokens


def test_unicode_survives_streaming(client):
    messages = [{"role": "user", "content": "Say hello in Japanese and add an emoji."}]
    whole = client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=30)
    text, chunks = stream_text(client, model="m", messages=messages, temperature=0, max_tokens=30)
    assert text == whole.choices[0].message.content
    assert any(ord(ch) > 0x2FFF for ch in text), f"expected CJK or emoji in {text!r}"
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"n": 2}, "n"),
        ({"top_logprobs": 2, "logprobs": False}, "top_logprobs"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"logit_bias": {"42": 10}}, "logit_bias"),
        ({"temperature": 3.0}, "temperature"),
        ({"extra_body": {"functions": [{"name": "f", "parameters": {}}]}}, "functions"),
        ({"extra_body": {"top_k": -1}}, "top_k"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
                    }
                ]
            },
            "messages[0].content[0].type",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
                        ],
                    }
                ]
            },
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}]},
            "messages[0].content[0].type",
        ),
    ],
)
def test_rejections_are_400_naming_the_parameter(client, kwargs, param):
    kwargs = {"model": "m", "messages": FRANCE, "max_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**kwargs)
    assert err.value.param == param
    assert err.value.status_code == 400


def test_tools_need_a_tool_convention(client):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=FRANCE, max_tokens=4, tools=tools)
    assert err.value.param == "tools"


def test_reasoning_effort_needs_a_reasoning_channel(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=FRANCE, max_tokens=4, reasoning_effort="high")
    assert err.value.param == "reasoning_effort"


def test_noop_fields_are_accepted(client):
    reply = client.chat.completions.create(
        model="m",
        messages=FRANCE,
        max_tokens=4,
        temperature=0,
        tool_choice="none",
        response_format={"type": "text"},
        metadata={"k": "v"},
        user="someone",
        store=False,
        service_tier="auto",
        n=1,
        logprobs=False,
    )
    assert reply.choices[0].message.content


def test_wrong_api_key_is_an_authentication_error(idle_server):
    for key in ("wrong-key", API_KEY + "x"):
        with openai_client(idle_server, api_key=key) as bad:
            with pytest.raises(openai.AuthenticationError) as err:
                bad.models.list()
            assert err.value.status_code == 401


def test_prompt_longer_than_the_context_is_a_400(client):
    long_prompt = "lorem ipsum " * 1200  # well over --ctx 1024 tokens
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": long_prompt}], stream=True
        )
    assert err.value.code == "context_length_exceeded" and err.value.param == "messages"


def test_oversized_body_is_413(client):
    huge = "x" * (9 * 1024 * 1024)
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": huge}], max_tokens=1)
    assert err.value.status_code == 413 and err.value.code == "request_too_large"
