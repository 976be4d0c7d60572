"""The request bodies of the OpenAI dialects (Chat Completions, Responses), as declared
schemas beside their parsers in api/protocol/. Enumerations and limits come from the parser
modules themselves; tests/api/test_openapi_document.py checks that each parser reads exactly
the fields declared here and refuses the wrong types and bounds declared here."""

from __future__ import annotations

from api.protocol import common
from api.protocol.chat import request as chat
from api.protocol.completions import request as completions
from api.protocol.embeddings import request as embeddings
from api.protocol.responses import request as responses
from api.protocol.responses import tools as responses_tools

from .declared import request_schema
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
    refused,
    string,
)

# -- shared by the OpenAI dialects -------------------------------------------------------------
# The structures of the refused logit_bias (only empty passes) and of stream_options.
LOGIT_BIAS = {"type": ["object", "null"], "maxProperties": 0}
STREAM_OPTIONS = obj({"include_usage": boolean()}, nullable=True)
FORMAT_TYPES = ("text", "json_object", "json_schema")


def reply_format() -> dict:
    """A reply format (Chat's ``response_format``, Responses' ``text.format``, Anthropic's
    ``output_config.format``): the schema sits in ``json_schema.schema`` (Chat Completions'
    placement) or directly in ``schema``; every dialect's parser takes either."""
    schema = json_schema_object("the JSON Schema the reply must match")
    holder = {
        "name": ignored(string()),
        "description": ignored(string()),
        "strict": ignored(boolean(), "accepted; the schema is always enforced"),
    }
    return obj(
        {
            "type": enum(FORMAT_TYPES),
            "schema": schema,
            "json_schema": obj({**holder, "schema": schema}, nullable=True),
            **holder,
        },
        ("type",),
        nullable=True,
    )


def function_declaration(flat: bool) -> dict:
    """A function tool: flat on Responses, under ``function`` on Chat Completions."""
    function = {
        "name": string(nullable=False, minLength=1),
        "description": string(),
        "parameters": obj({}, description="JSON Schema of the arguments", nullable=True),
        "strict": boolean(),
    }
    if flat:
        return obj({"type": const("function"), **function}, ("type", "name"))
    return obj({"type": const("function"), "function": obj(function, ("name",))}, ("type", "function"))


# -- Chat Completions --------------------------------------------------------------------------
CHAT_PART = any_of(
    obj({"type": const("text"), "text": string(nullable=False)}, ("type", "text")),
    obj({"type": const("refusal"), "refusal": string(nullable=False)}, ("type", "refusal")),
)
CHAT_TOOL_CALL = obj(
    {
        "id": ignored(string()),
        "type": ignored(string()),
        "function": obj(
            {"name": string(nullable=False, minLength=1), "arguments": string("a JSON object, as text")},
            ("name", "arguments"),
        ),
    },
    ("function",),
)
CHAT_MESSAGE = obj(
    {
        "role": enum(chat.ROLES, "developer is read as system"),
        "content": any_of(string(nullable=True), array(CHAT_PART, nullable=False)),
        "name": string(),
        "tool_call_id": string("on a role tool message: the call it answers"),
        "tool_calls": array(CHAT_TOOL_CALL, "on an assistant message: the calls it made"),
        "function_call": refused("the legacy functions API: refused"),
    },
    ("role", "content"),
)
CHAT_TOOL_CHOICE = any_of(
    enum(("auto", "none", "required"), nullable=True),
    obj({"type": const("function"), "function": obj({"name": string(nullable=False)}, ("name",))}, ("type",)),
)
CHAT_COMPLETION_REQUEST = request_schema(
    chat.FIELDS,
    {
        "messages": array(CHAT_MESSAGE, nullable=False, minItems=1),
        "logit_bias": LOGIT_BIAS,
        "modalities": array(enum(("text",))),
        "response_format": reply_format(),
        "stream_options": STREAM_OPTIONS,
        "tool_choice": CHAT_TOOL_CHOICE,
        "tools": array(function_declaration(flat=False)),
    },
    "OpenAI Chat Completions request; unknown fields are accepted and ignored",
)
# x-lmserve-needs: the fields a value above the minimum needs beside it (the request's if/then
# below says the same in JSON Schema); ChatCompletionRequest.parse checks it.
CHAT_COMPLETION_REQUEST["properties"]["top_logprobs"]["x-lmserve-needs"] = {"logprobs": True}
CHAT_COMPLETION_REQUEST |= {  # top_logprobs above 0 without logprobs: true is a 400, as OpenAI's
    "if": {"properties": {"top_logprobs": {"type": "integer", "minimum": 1}}, "required": ["top_logprobs"]},
    "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]},
}

# -- Responses ---------------------------------------------------------------------------------
RESPONSES_PART = obj(
    {
        "type": enum(responses.TEXT_PART_KEYS),
        "text": string("the text of input_text, output_text and text parts"),
        "refusal": string("the text of a refusal part"),
    },
    ("type",),
)
RESPONSES_ITEM = any_of(
    obj(
        {
            "type": const("message"),
            "role": enum(responses.ROLES, "developer is read as system"),
            "content": any_of(string(nullable=False), array(RESPONSES_PART, nullable=False)),
        },
        ("role", "content"),
        "a message (type may be left out)",
    ),
    obj({"type": const("reasoning")}, ("type",), "earlier reasoning: dropped, as in a stateless replay"),
    obj(
        {
            "type": const("function_call"),
            "name": string(nullable=False, minLength=1),
            "namespace": string("the namespace the function was declared in"),
            "call_id": string(),
            "arguments": string("a JSON object, as text"),
        },
        ("type", "name", "arguments"),
    ),
    obj(
        {
            "type": const("custom_tool_call"),
            "name": string(nullable=False, minLength=1),
            "namespace": string("the namespace the tool was declared in"),
            "call_id": string(),
            "input": string("the tool's free-form input", nullable=False),
        },
        ("type", "name", "input"),
    ),
    *(
        obj(
            {
                "type": const(kind),
                "call_id": string(),
                "output": any_of(
                    string(nullable=False), array(obj({"text": string(nullable=False)}, ("text",)))
                ),
            },
            ("type", "output"),
        )
        for kind in ("function_call_output", "custom_tool_call_output")
    ),
)
CUSTOM_TOOL = obj(
    {
        "type": const("custom"),
        "name": string(nullable=False, minLength=1),
        "description": string(),
        "format": obj(
            {
                "type": enum(("text", "grammar")),
                "syntax": enum(responses_tools.GRAMMAR_SYNTAXES, nullable=True),
                "definition": string("the grammar (required for type grammar)", minLength=1),
            },
            ("type",),
            "free text, or a grammar the input must match (enforced when tool_choice forces the tool)",
            nullable=True,
        ),
    },
    ("type", "name"),
    "a free-form tool: the model writes its input as text",
)
RESPONSES_TOOL = any_of(
    function_declaration(flat=True),
    CUSTOM_TOOL,
    obj(
        {
            "type": const("namespace"),
            "name": string(nullable=False, minLength=1),
            "description": string(),
            "tools": array(any_of(function_declaration(flat=True), CUSTOM_TOOL), nullable=False),
        },
        ("type", "name", "tools"),
        "function and custom tools grouped under a name (the model sees namespace.name)",
    ),
    obj(
        {"type": string(nullable=False, pattern="^(" + "|".join(responses_tools.HOSTED_TOOL_PREFIXES) + ")")},
        ("type",),
        "a hosted tool: left out of the prompt (a tool_choice forcing it is a 400)",
    ),
)
RESPONSES_TOOL_CHOICE = any_of(
    enum(responses_tools.CHOICE_WORDS, nullable=True),
    obj(
        {
            "type": enum(responses_tools.CLIENT_TOOL_KINDS),
            "name": string(nullable=False),
            "namespace": string(),
        },
        ("type", "name"),
    ),
)
RESPONSES_REQUEST = request_schema(
    responses.FIELDS,
    {
        "include": array(
            string(nullable=False),
            "message.output_text.logprobs: the output text's log probabilities; other values are ignored",
        ),
        "input": any_of(string(nullable=False), array(RESPONSES_ITEM, nullable=False, minItems=1)),
        "reasoning": obj(
            {"effort": enum(common.EFFORTS, "above minimal needs a reasoning model", nullable=True)},
            nullable=True,
        ),
        "text": obj({"format": reply_format()}, nullable=True),
        "tool_choice": RESPONSES_TOOL_CHOICE,
        "tools": array(RESPONSES_TOOL),
    },
    "OpenAI Responses request (stateless: store false); unknown fields are accepted and ignored",
)

EMBEDDINGS_REQUEST = request_schema(
    embeddings.FIELDS,
    {
        "input": any_of(
            string(nullable=False, minLength=1),
            array(
                string(nullable=False, minLength=1),
                nullable=False,
                minItems=1,
                maxItems=embeddings.MAX_INPUTS,
            ),
            description="text, or an array of texts (token-id arrays are refused)",
        ),
    },
    "OpenAI Embeddings request: the final-norm last hidden state, L2-normalised",
)

# -- Completions (legacy) ----------------------------------------------------------------------
TOKEN_IDS = array(integer(nullable=False), nullable=False, minItems=1)
COMPLETION_REQUEST = request_schema(
    completions.FIELDS,
    {
        "prompt": any_of(
            string(nullable=False),
            TOKEN_IDS,
            array(any_of(string(nullable=False), TOKEN_IDS), nullable=False, minItems=1, maxItems=1),
            description="raw text (no chat template; special-token texts parsed, BOS as the model's "
            "metadata says), token ids, or a one-element array of either",
        ),
        "logit_bias": LOGIT_BIAS,
        "stream_options": STREAM_OPTIONS,
    },
    "OpenAI (legacy) Completions request; unknown fields are accepted and ignored",
)
