"""The request bodies of Anthropic Messages (``/v1/messages`` and its ``count_tokens``), as
declared schemas beside their parser in api/protocol/anthropic.py (cross-checked against it by
tests/api/test_openapi_document.py)."""

from __future__ import annotations

from api.protocol import common
from api.protocol.anthropic import request as anthropic
from api.protocol.anthropic import tools as anthropic_tools

from .openai_requests import SAMPLING, reply_format
from .shapes import (
    any_of,
    array,
    boolean,
    const,
    enum,
    ignored,
    in_range,
    integer,
    json_schema_object,
    obj,
    refused,
    string,
)

TEXT_BLOCK = obj({"type": const("text"), "text": string(nullable=False)}, ("type", "text"))
TOOL_USE_BLOCK = obj(
    {
        "type": const("tool_use"),
        "id": string(),
        "name": string(nullable=False, minLength=1),
        "input": obj({}, description="the call's arguments"),
    },
    ("type", "name", "input"),
    "in an assistant message: a call it made",
)
TOOL_RESULT_BLOCK = obj(
    {
        "type": const("tool_result"),
        "tool_use_id": string("the id of a tool_use block of the message before"),
        "content": any_of(string(nullable=False), array(TEXT_BLOCK, nullable=False)),
        "is_error": boolean(),
    },
    ("type", "tool_use_id"),
    "in a user message: the result of a call",
)
THINKING_BLOCK = obj(
    {"type": enum(anthropic.DROPPED_BLOCKS)}, ("type",), "earlier thinking: dropped from the prompt"
)
MESSAGE = obj(
    {
        "role": enum(anthropic.ROLES),
        "content": any_of(
            string(nullable=False),
            array(any_of(TEXT_BLOCK, TOOL_USE_BLOCK, TOOL_RESULT_BLOCK, THINKING_BLOCK), nullable=False),
        ),
    },
    ("role", "content"),
)
TOOL = obj(
    {
        "type": enum(("custom",), "client tools only; server tools are refused", nullable=True),
        "name": string(nullable=False, minLength=1),
        "description": string(),
        "input_schema": json_schema_object("JSON Schema of the tool's input"),
        "strict": boolean(),
    },
    ("name", "input_schema"),
)
TOOL_CHOICE = obj(
    {
        "type": enum(anthropic_tools.CHOICE_TYPES),
        "name": string("the tool to call, with type tool"),
        "disable_parallel_tool_use": ignored(boolean()),
    },
    ("type",),
    nullable=True,
)
THINKING = obj(
    {
        "type": enum(anthropic.THINKING_TYPES, "enabled and adaptive switch a reasoning channel on"),
        "budget_tokens": integer(lo=1, description="required with type enabled"),
    },
    ("type",),
    nullable=True,
)
THREAD = refused(
    "message threads: this server holds no thread state (a continue is a 404, anything else a 400)",
    obj({"type": string(), "previous_message_id": string()}, nullable=True),
)


def _prompt_fields() -> dict:
    """What both /v1/messages and count_tokens read: the conversation, tools and formats."""
    return {
        "messages": array(MESSAGE, nullable=False, minItems=1),
        "model": string("accepted and ignored: one process serves one model"),
        "system": any_of(string(nullable=True), array(TEXT_BLOCK, nullable=False)),
        "tools": array(TOOL),
        "tool_choice": TOOL_CHOICE,
        "output_config": obj({"format": reply_format()}, nullable=True),
        "output_format": reply_format(),
        "regex": SAMPLING["regex"],
        "lark": SAMPLING["lark"],
        "thinking": THINKING,
        "thread": THREAD,
        "mcp_servers": refused("server-side MCP tools are refused", array({}, maxItems=0)),
        "container": refused("server-side code execution is refused"),
    }


MESSAGES_REQUEST = obj(
    {
        "max_tokens": integer(lo=1, nullable=False),
        **_prompt_fields(),
        "stop_sequences": array(
            string(nullable=False, minLength=1),
            f"up to {common.MAX_ANTHROPIC_STOP_SEQUENCES} non-empty strings that end the reply (not sent)",
            maxItems=common.MAX_ANTHROPIC_STOP_SEQUENCES,
        ),
        "stream": boolean("answer as server-sent Messages events"),
        **{
            name: in_range(common.sampling_range(name, anthropic.TEMPERATURE_MAX))
            for name in anthropic.SAMPLING
        },
        "ignore_eos": boolean("extension (llama.cpp): keep generating past the end-of-turn token"),
    },
    ("max_tokens", "messages"),
    "Anthropic Messages request; unknown fields are accepted and ignored",
)
# The same parser reads a count_tokens body: everything but max_tokens (sampling is read, unused).
COUNT_TOKENS_REQUEST = obj(
    {k: v for k, v in MESSAGES_REQUEST["properties"].items() if k != "max_tokens"},
    ("messages",),
    "the prompt of a Messages request, counted without generating",
)
