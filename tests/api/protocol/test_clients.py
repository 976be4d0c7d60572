"""What real clients and agent frameworks trip on, without a server: Anthropic threads and
tool_result pairing, Claude Code's client-metadata system block, the newest SDK fields and
the context-overflow wording clients parse."""

from __future__ import annotations

import pytest

from api.errors import ApiError
from api.protocol.anthropic import MessagesRequest
from api.protocol.chat import ChatCompletionRequest
from inference.types import ContextOverflow, Error

USER = [{"role": "user", "content": "hi"}]
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.a1b; cc_entrypoint=cli; cch=1234;"
CALL = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}


def parse(**fields):
    return MessagesRequest.parse({"max_tokens": 16, "messages": USER, **fields})


def test_a_thread_create_is_400_thread_unsupported_request():
    error = parse(thread={"type": "create"})
    assert isinstance(error, ApiError) and error.status == 400 and error.param == "thread"
    payload = error.anthropic_payload()["error"]
    assert payload["type"] == "invalid_request_error"
    assert payload["details"] == {"error_code": "thread_unsupported_request"}


def test_a_thread_continue_is_404_thread_not_found():
    # Sent before validating the messages: a continued turn carries only its new tool_result.
    lone_result = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]}]
    error = parse(thread={"type": "continue", "previous_message_id": "msg_9"}, messages=lone_result)
    assert isinstance(error, ApiError) and error.status == 404 and "msg_9" in error.message
    payload = error.anthropic_payload()["error"]
    assert payload["type"] == "not_found_error" and payload["details"] == {"error_code": "thread_not_found"}


def test_no_thread_is_a_plain_request():
    assert isinstance(parse(thread=None), MessagesRequest)


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "21"}]}],
        [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [{**CALL, "id": "toolu_other"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "21"}]},
        ],
        [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [CALL]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "21"}]},
            {"role": "assistant", "content": "21 degrees"},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
        ],
    ],
)
def test_a_tool_result_without_its_tool_use_in_the_previous_message_is_400(messages):
    error = parse(messages=messages)
    assert isinstance(error, ApiError) and error.status == 400
    assert "toolu_1" in error.message and error.param.endswith("tool_use_id")


def test_a_tool_result_answering_the_previous_tool_use_is_accepted():
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, CALL]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "21"}]},
    ]
    request = parse(messages=messages)
    assert isinstance(request, MessagesRequest)
    assert [m.role for m in request.messages] == ["user", "assistant", "tool"]


def test_the_billing_header_system_block_is_dropped():
    system = [
        {"type": "text", "text": BILLING},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
    ]
    request = parse(system=system)
    assert request.system == "You are Claude Code."
    assert parse(system=[{"type": "text", "text": BILLING}]).system == ""


@pytest.mark.parametrize(
    "fields",
    [
        {"cache_control": {"type": "ephemeral"}},
        {"service_tier": "standard_only"},
        {"inference_geo": "us"},
        {"speed": "fast"},
        {"metadata": {"user_id": "u"}},
        {"diagnostics": {"previous_message_id": "msg_1"}},
        {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
        {"compaction": {"type": "auto"}},
        {"fallbacks": [{"model": "claude-x"}]},
        {"user_profile_id": "p", "workspace_id": "w"},
        {"output_config": {"effort": "max"}},
        {"thinking": {"type": "adaptive", "display": "omitted"}},
        {"thinking": {"type": "between_tools"}},
        {"thread": False},
    ],
)
def test_newest_anthropic_fields_are_accepted_and_ignored(fields):
    assert isinstance(parse(**fields), MessagesRequest)


def test_top_logprobs_zero_is_accepted_on_chat():
    body = {"messages": USER, "top_logprobs": 0}
    assert isinstance(ChatCompletionRequest.parse(body), ChatCompletionRequest)
    refused = ChatCompletionRequest.parse({**body, "top_logprobs": 2})
    assert isinstance(refused, ApiError) and refused.param == "top_logprobs"


def test_context_overflow_is_worded_as_each_dialects_clients_parse():
    overflow = ContextOverflow(prompt_tokens=2131, n_ctx=2048)
    error = ApiError.from_event(
        Error(400, "too long", code="context_length_exceeded", param="messages", overflow=overflow)
    )
    assert error.anthropic_payload()["error"]["message"] == "prompt is too long: 2131 tokens > 2048 maximum"
    openai_error = error.openai_payload()["error"]
    assert openai_error["code"] == "context_length_exceeded" and openai_error["message"] == "too long"
