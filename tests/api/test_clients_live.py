"""What real clients need from a live server, through the real SDKs: the newest SDK fields,
Anthropic threads and the tool runner, the Anthropic /v1/models shape, context-overflow
wording, Claude Code's client-metadata system block, replies that validate against OpenAI's
published schemas, streams that start and keep alive while a request waits, and prefill that
stops when the client hangs up."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest
from anthropic.types import ThreadNotFoundError

from .conftest import API_KEY, anthropic_client, openai_client
from .protocol.test_openapi_shapes import STREAM_EVENTS, errors_of
from .rawhttp import RawRequest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HI = [{"role": "user", "content": "Hi"}]
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.{}; cc_entrypoint=cli; cch={};"
KEY = {"authorization": f"Bearer {API_KEY}"}


@pytest.fixture
def claude(idle_server):
    with anthropic_client(idle_server, timeout=300) as c:
        yield c


@pytest.fixture
def oai(idle_server):
    with openai_client(idle_server, timeout=300) as c:
        yield c


def accepted_or_named(call, name: str) -> None:
    """The SDK call succeeds, or fails with a 400 whose message names the field: never a 5xx."""
    try:
        call()
    except (anthropic.APIStatusError, openai.APIStatusError) as exc:
        assert exc.status_code == 400 and name.split(".")[0] in str(exc), f"{name}: {exc}"


# -- point 6: the newest SDK fields ----------------------------------------------------------
ANTHROPIC_FIELDS = {
    "cache_control": {"type": "ephemeral"},
    "service_tier": "auto",
    "container": "container_1",
    "inference_geo": "us",
    "speed": "fast",
    "metadata": {"user_id": "u"},
    "diagnostics": {"previous_message_id": "msg_1"},
    "output_config": {"effort": "max"},
    "thinking": {"type": "adaptive", "display": "omitted"},
    "user_profile_id": "p",
    "workspace_id": "w",
    "extra_body": {"temperature": 0.3, "top_p": 0.9, "top_k": 5},
}
ANTHROPIC_BETA_FIELDS = {
    "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
    "compaction": {"type": "auto"},
    "fallbacks": [{"model": "claude-x"}],
    "mcp_servers": [{"type": "url", "url": "http://localhost:1", "name": "n"}],
    "betas": ["context-management-2025-06-27", "interleaved-thinking-2025-05-14"],
}
CHAT_FIELDS = {
    "prediction": {"type": "content", "content": "Hello"},
    "verbosity": "low",
    "moderation": {"model": "omni-moderation-latest"},
    "prompt_cache_key": "k",
    "prompt_cache_retention": "24h",
    "safety_identifier": "s",
    "service_tier": "flex",
    "store": True,
    "metadata": {"a": "b"},
    "parallel_tool_calls": False,
    "user": "u",
    "modalities": ["text"],
    "top_logprobs": 0,
    "reasoning_effort": "minimal",
}
RESPONSES_FIELDS = {
    "access_programs": {"cyber": "standard"},
    "background_options": {"completion_window": "soonest"},
    "context_management": [{"type": "compaction", "compact_threshold": 1000}],
    "image": {"context_compression": "auto"},
    "include": ["reasoning.encrypted_content"],
    "max_tool_calls": 3,
    "moderation": {"model": "omni-moderation-latest"},
    "prompt_cache_key": "k",
    "prompt_cache_retention": "24h",
    "safety_identifier": "s",
    "service_tier": "auto",
    "store": False,
    "metadata": {"a": "b"},
    "truncation": "disabled",
    "user": "u",
}


@pytest.mark.parametrize("name", ANTHROPIC_FIELDS)
def test_newest_anthropic_fields(claude, name):
    value = ANTHROPIC_FIELDS[name]
    accepted_or_named(
        lambda: claude.messages.create(model="m", max_tokens=2, messages=HI, **{name: value}), name
    )


@pytest.mark.parametrize("name", ANTHROPIC_BETA_FIELDS)
def test_newest_anthropic_beta_fields(claude, name):
    value = ANTHROPIC_BETA_FIELDS[name]
    create = claude.beta.messages.create
    accepted_or_named(lambda: create(model="m", max_tokens=2, messages=HI, **{name: value}), name)


@pytest.mark.parametrize("name", CHAT_FIELDS)
def test_newest_chat_fields(oai, name):
    value = CHAT_FIELDS[name]
    create = oai.chat.completions.create
    accepted_or_named(lambda: create(model="m", max_completion_tokens=2, messages=HI, **{name: value}), name)


@pytest.mark.parametrize("name", RESPONSES_FIELDS)
def test_newest_responses_fields(oai, name):
    value = RESPONSES_FIELDS[name]
    create = oai.responses.create
    accepted_or_named(lambda: create(model="m", max_output_tokens=16, input="Hi", **{name: value}), name)


def test_live_replies_validate_against_the_published_schemas(http):
    chat = http.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 4}).json()
    assert errors_of("CreateChatCompletionResponse", chat) == []
    body = {"messages": HI, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert chunks and all(errors_of("CreateChatCompletionStreamResponse", c) == [] for c in chunks)
    response = http.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 4}).json()
    assert errors_of("Response", response) == []
    with http.stream(
        "POST", "/v1/responses", json={"input": "Hi", "max_output_tokens": 4, "stream": True}
    ) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert [e["type"] for e in events][-1] == "response.incomplete"
    assert all(errors_of(STREAM_EVENTS[e["type"]], e) == [] for e in events)
    error = http.post("/v1/chat/completions", json={"messages": []})
    assert error.status_code == 400 and errors_of("ErrorResponse", error.json()) == []


# -- point 7: agent frameworks ---------------------------------------------------------------
def test_threads_are_refused_as_the_real_api_refuses_them(claude):
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.beta.messages.create(model="m", max_tokens=2, messages=HI, thread={"type": "create"})
    assert refused.value.body["error"]["details"]["error_code"] == "thread_unsupported_request"
    with pytest.raises(ThreadNotFoundError):
        claude.beta.messages.create(
            model="m", max_tokens=2, messages=HI, thread={"type": "continue", "previous_message_id": "msg_x"}
        )


def test_the_tool_runner_falls_back_to_unthreaded_turns(claude, idle_server):
    @anthropic.beta_tool
    def get_time() -> str:
        """The time now."""
        return "12:00"

    logged = len(idle_server.logs())
    runner = claude.beta.messages.tool_runner(
        model="m", max_tokens=8, messages=HI, tools=[get_time], extra_body={"temperature": 0}
    )
    final = runner.until_done()
    assert final.role == "assistant" and final.stop_reason in ("end_turn", "max_tokens")
    # The first turn asked for a thread and was refused; the runner then resent it unthreaded.
    statuses = [
        line.split()[2] for line in idle_server.logs()[logged:].splitlines() if "POST /v1/messages" in line
    ]
    assert statuses == ["400", "200"]


def test_a_tool_result_without_its_tool_use_is_400(claude):
    lone = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "21"}]}]
    with pytest.raises(anthropic.BadRequestError, match="toolu_9"):
        claude.messages.create(model="m", max_tokens=2, messages=lone)


def test_models_answer_in_the_anthropic_shape_to_anthropic_clients(claude, oai):
    page = claude.models.list()
    (model,) = page.data
    assert model.type == "model" and model.display_name == model.id and model.created_at.year > 2000
    assert page.has_more is False and page.first_id == page.last_id == model.id
    assert claude.models.retrieve(model.id).id == model.id
    assert [m.id for m in oai.models.list().data] == [model.id]  # OpenAI clients keep theirs


def test_context_overflow_wording_clients_recognise(claude, oai):
    long = [{"role": "user", "content": "word " * 1500}]  # the shared server's --ctx is 1024
    with pytest.raises(anthropic.BadRequestError, match=r"prompt is too long: \d+ tokens > 1024 maximum"):
        claude.messages.create(model="m", max_tokens=2, messages=long)
    with pytest.raises(openai.BadRequestError) as chat:
        oai.chat.completions.create(model="m", messages=long)
    assert chat.value.code == "context_length_exceeded" and chat.value.param == "messages"
    assert "maximum context length is 1024 tokens. However, your messages resulted in" in chat.value.message
    with pytest.raises(openai.BadRequestError) as responses:
        oai.responses.create(model="m", input=long)
    assert responses.value.code == "context_length_exceeded" and responses.value.param == "input"


# -- point 8: Claude Code ------------------------------------------------------------------------
def test_the_billing_header_block_does_not_defeat_the_prompt_cache(claude):
    rules = "You are a careful assistant. " * 20

    def ask(version: str):
        system = [{"type": "text", "text": BILLING.format(version, version)}, {"type": "text", "text": rules}]
        return claude.messages.create(
            model="m", max_tokens=1, system=system, messages=HI, extra_body={"temperature": 0}
        )

    ask("a1")
    again = ask("b2")  # a new prompt: Claude Code changes the block every time
    usage = again.usage
    assert usage.cache_read_input_tokens >= 0.9 * (usage.input_tokens + usage.cache_read_input_tokens)


@pytest.fixture(scope="module")
def slow_start_server(tmp_path_factory):
    """A server whose streams open after 0.3 s without tokens and keep alive every 0.3 s."""
    from .conftest import start_lmserve

    flags = ["--api-key", API_KEY, "--ctx", "4096", "--stream-start-after", "0.3", "--keepalive", "0.3"]
    server = start_lmserve(tmp_path_factory.mktemp("slow-start"), *flags)
    yield server
    server.stop()


def long_prompt(topic: str, n: int) -> list[dict]:
    """A prompt of about ``n`` tokens that no other test's prompt shares a prefix with."""
    return [{"role": "user", "content": f"About {topic}: " + "word " * n}]


@pytest.mark.parametrize(
    ("path", "body", "opening", "keepalive"),
    [
        (
            "/v1/chat/completions",
            {"max_tokens": 2},
            b'"delta":{"role":"assistant","content":""}',
            b": keep-alive\n\n",
        ),
        ("/v1/messages", {"max_tokens": 2}, b"event: message_start", b"event: ping\n"),
        # The opening has one response.in_progress; the keep-alives repeat it.
        (
            "/v1/responses",
            {"max_output_tokens": 2},
            b"event: response.created",
            b"event: response.in_progress\n",
        ),
    ],
)
def test_a_waiting_stream_opens_and_keeps_alive(slow_start_server, path, body, opening, keepalive):
    words = long_prompt(path, 1200)
    conversation = {"input": words} if path == "/v1/responses" else {"messages": words}
    request = RawRequest(slow_start_server.url, path, {**conversation, **body, "stream": True}, KEY)
    in_opening = 1 if path == "/v1/responses" else 0
    try:
        head = request.read_until(lambda got: got.count(keepalive) > in_opening)
        assert head.startswith(b"HTTP/1.1 200") and opening in head
        assert head.index(opening) < head.rindex(keepalive)
        request.read_all()
    finally:
        request.close()
    ends = (
        b"data: [DONE]",
        b"event: message_stop",
        b"event: response.incomplete",
        b"event: response.completed",
    )
    assert any(end in request.received for end in ends)  # the reply then streamed to its end
    assert request.received.count(keepalive) >= 1 + in_opening


def test_the_anthropic_sdk_reads_a_stream_with_pings(slow_start_server):
    with anthropic_client(slow_start_server, timeout=300) as claude:
        messages = long_prompt("delta", 1200)
        with claude.messages.stream(model="m", max_tokens=3, messages=messages) as stream:
            final = stream.get_final_message()
    assert final.stop_reason in ("end_turn", "max_tokens") and final.content[0].type == "text"
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens > 1200


def test_a_hang_up_stops_prefill_and_the_retry_resumes_from_cache(slow_start_server):
    messages = long_prompt("epsilon", 2500)
    request = RawRequest(
        slow_start_server.url,
        "/v1/chat/completions",
        {"messages": messages, "stream": True, "max_tokens": 1},
        KEY,
    )
    request.read_until(lambda got: b"data: " in got)  # the stream opened: prefill is under way
    request.close()
    slow_start_server.wait_idle(timeout=600)
    retry = httpx.post(
        slow_start_server.url + "/v1/chat/completions",
        json={"messages": messages, "max_tokens": 1},
        headers=KEY,
        timeout=600,
    ).json()["usage"]
    cached = retry["prompt_tokens_details"]["cached_tokens"]
    # Rows prefilled before the hang-up were kept; the rest never ran (a prefill run to the end
    # would leave the whole prompt cached).
    assert 0 < cached < retry["prompt_tokens"] - 1, retry
