"""The request bodies of Anthropic Messages (``/v1/messages`` and its ``count_tokens``), as
declared schemas beside their parser in api/protocol/anthropic.py (cross-checked against it by
tests/api/test_openapi_document.py)."""

from __future__ import annotations

from api.protocol.anthropic import request as anthropic
from api.protocol.anthropic import tools as anthropic_tools

from .declared import request_schema
from .openai_requests import reply_format
from .shapes import (
    any_of,
    array,
    boolean,
    const,
    enum,
    ignored,
    integer,
    json_schema_object,
    obj,
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
SHAPES = {
    "messages": array(MESSAGE, nullable=False, minItems=1),
    "mcp_servers": array({}, maxItems=0),
    "output_config": obj({"format": reply_format()}, nullable=True),
    "system": any_of(string(nullable=True), array(TEXT_BLOCK, nullable=False)),
    "thinking": THINKING,
    "tool_choice": TOOL_CHOICE,
    "tools": array(TOOL),
    "output_format": reply_format(),
    "thread": obj({"type": string(), "previous_message_id": string()}, nullable=True),
}
MESSAGES_REQUEST = request_schema(
    anthropic.FIELDS, SHAPES, "Anthropic Messages request; unknown fields are accepted and ignored"
)
# The same parser reads a count_tokens body: everything but max_tokens (sampling is read, unused).
COUNT_TOKENS_REQUEST = request_schema(
    anthropic.COUNT_TOKENS_FIELDS, SHAPES, "the prompt of a Messages request, counted without generating"
)
