"""Anthropic Messages: request validation onto the dialect-free GenerationRequest.

A translation layer over the same normalized request as the OpenAI dialects. Honored: system (a
string or text blocks), system-role messages inside ``messages`` (Claude Code's agent list;
rendered in place where the chat template allows it, else folded into the system text in
order), messages with text blocks (earlier thinking / redacted_thinking blocks are dropped,
like replayed reasoning items), temperature, top_p, top_k, the required max_tokens,
stop_sequences (at most 16), stream and thinking (enabled / adaptive switch the reasoning
channel on where the model has one; a no-op elsewhere), output_config.format, the ``regex`` and
``lark`` extensions (as on the OpenAI dialects), an assistant prefill (a final assistant
message, which the reply continues), and client tools (:mod:`api.protocol.anthropic.tools`;
dropped on a model without a tool convention). Client metadata (Claude Code's
``x-anthropic-billing-header:`` system block) is dropped before rendering. Bookkeeping and
hosted-service fields (metadata, service_tier, cache_control, inference_geo, speed,
diagnostics, context_management, compaction, fallbacks, user_profile_id, workspace_id,
output_config.effort) are ignored. Images, documents, server tools, mcp_servers and container
are refused (400); ``thread`` is answered as the real API answers a request threads cannot
serve. The encoders live in :mod:`api.protocol.anthropic.encoder`.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.errors import ApiError, bad_request, unsupported
from inference.generation.constraints import ConstraintSpec
from inference.generation.toolcall import ToolSpec
from inference.types import GenerationRequest, Message

from .. import common
from .. import fields as f
from ..common import MAX_ANTHROPIC_STOP_SEQUENCES, sampling_field, sampling_overrides
from ..fields import Invalid
from ..formats import one_constraint, parse_extensions, parse_format
from ..request_fields import (
    Flag,
    Integer,
    Nothing,
    RequestField,
    Shape,
    StopStrings,
    as_sent,
    read_fields,
    refuse_any,
    refuse_non_empty,
)
from .tools import (
    SERVER_TOOL_PREFIXES,
    check_tool_results,
    parse_anthropic_tool_choice,
    parse_anthropic_tools,
    tool_result_message,
    tool_use_call,
    without_tools,
)

# Claude Code sends "system" messages inside ``messages`` (its agent list): rendered in place.
ROLES = ("user", "assistant", "system")
DROPPED_BLOCKS = ("thinking", "redacted_thinking")  # earlier reasoning never reaches the prompt
MEDIA_BLOCKS = {"image": "image input", "document": "document input", "search_result": "search results"}
THINKING_TYPES = ("enabled", "adaptive", "between_tools", "disabled")
TEMPERATURE_MAX = 1.0  # Anthropic's temperature runs from 0 to 1
# Claude Code's first system block is client metadata that changes with every prompt: rendered,
# it would defeat the prompt cache for everything after it.
CLIENT_METADATA_PREFIX = "x-anthropic-billing-header:"
THREADS = "this server is stateless and holds no thread; send the whole conversation without 'thread'"
BLOCK_SEPARATOR = "\n"  # text blocks are separate pieces of text: never glue words together


def _read_messages(body: dict, name: str) -> tuple[tuple[Message, ...], str]:
    """The messages and the prefill (see :func:`parse_messages`); every tool_result answers a
    tool_use of the message before."""
    messages = parse_messages(body.get(name))
    check_tool_results(body[name])
    return messages


def _read_output_config(body: dict, name: str) -> ConstraintSpec | None:
    output_config = f.obj(body, name)
    return parse_format(output_config.get("format"), f"{name}.format") if output_config else None


# The request body's fields, in the order of Anthropic's reference, then the older
# output_format, the threads beta and our extensions: what ``parse`` reads and what the
# OpenAPI document declares (api/openapi/anthropic_requests.py gives the Shape fields'
# structures). Bookkeeping and hosted-service fields (metadata, service_tier, inference_geo,
# context_management, ...) are not declared: accepted and ignored like any unknown field. The
# lambdas look up parsers defined further down when they are called.
FIELDS = (
    RequestField("max_tokens", Integer(lo=1), required=True),
    RequestField("messages", Shape(), required=True, combined=True, read=_read_messages),
    common.MODEL,
    RequestField(
        "container",
        Nothing(),
        refused="server-side code execution is refused",
        read=refuse_any("(server-side code execution) is not supported"),
    ),
    RequestField(
        "mcp_servers",
        Shape(),
        refused="server-side MCP tools are refused",
        read=refuse_non_empty(f.array, "(server-side MCP tools) is not supported"),
    ),
    RequestField("output_config", Shape(), combined=True, read=_read_output_config),
    RequestField(
        "stop_sequences",
        StopStrings(single=False, limit=MAX_ANTHROPIC_STOP_SEQUENCES),
        f"up to {MAX_ANTHROPIC_STOP_SEQUENCES} non-empty strings that end the reply (not sent)",
    ),
    RequestField("stream", Flag(), "answer as server-sent Messages events"),
    RequestField("system", Shape(), read=lambda body, name: parse_system(body.get(name))),
    sampling_field("temperature", temperature_max=TEMPERATURE_MAX),
    RequestField("thinking", Shape(), read=lambda body, name: _parse_thinking(body, name)),
    RequestField("tool_choice", Shape(), combined=True, read=as_sent),
    RequestField("tools", Shape(), combined=True, read=lambda body, _name: parse_anthropic_tools(body)),
    sampling_field("top_k"),
    sampling_field("top_p"),
    RequestField(
        "output_format", Shape(), combined=True, read=lambda body, name: parse_format(body.get(name), name)
    ),
    RequestField(
        "thread",
        Shape(),
        refused="message threads: this server holds no thread state "
        "(a continue is a 404, anything else a 400)",
        read=lambda body, _name: refuse_thread(body),
    ),
    common.IGNORE_EOS,
    common.REGEX,
    common.LARK,
)
# A count_tokens body: the same fields but max_tokens (sampling is read, and unused).
COUNT_TOKENS_FIELDS = tuple(field for field in FIELDS if field.name != "max_tokens")


@dataclass(frozen=True, kw_only=True)
class MessagesRequest:
    """A validated request; fields in the order of Anthropic's reference, then our extension.

    Each field of :data:`FIELDS` that is not combined, refused or ignored becomes the attribute
    of the same name; the others are what ``parse`` makes of the combined ones."""

    max_tokens: int | None = None  # required on /v1/messages; count_tokens has none
    messages: tuple[Message, ...]
    model: str | None = None  # accepted and ignored: one process serves one model
    stop_sequences: tuple[str, ...] = ()
    stream: bool = False
    system: str | None = None
    temperature: float | None = None
    thinking: bool = False  # thinking.type enabled or adaptive
    top_k: int | None = None
    top_p: float | None = None
    ignore_eos: bool = False  # extension, as on the OpenAI dialects
    constraint: ConstraintSpec | None = None  # output_config.format, output_format, regex, lark, forced call
    tools: tuple[ToolSpec, ...] = ()  # as the model sees them (none under tool_choice "none")
    forced_call: bool = False  # tool_choice any / tool: the constraint is the call grammar
    prefill: str = ""  # a final assistant message's text: the reply continues it

    @classmethod
    def parse(cls, body: dict, *, count_only: bool = False) -> MessagesRequest | ApiError:
        """Validate a decoded JSON object (a count_tokens body when ``count_only``: no
        max_tokens, no sampling); the first problem found is returned as an ApiError."""
        try:
            read = read_fields(COUNT_TOKENS_FIELDS if count_only else FIELDS, body)
            tools, forced = parse_anthropic_tool_choice(body, read["tools"])
            messages, prefill = read["messages"]
            # The reply's format: output_config.format, the older output_format, or the regex /
            # lark extension the OpenAI dialects take; at most one of them.
            output_format = one_constraint(
                read["output_config"], read["output_format"], parse_extensions(read["regex"], read["lark"])
            )
            if prefill and output_format is not None:
                message = f"'{output_format.param}' cannot be combined with a prefilled assistant message"
                raise Invalid(bad_request(message, output_format.param))
            return cls(
                **read.attributes(),
                messages=messages,
                prefill=prefill,
                tools=tools,
                forced_call=forced is not None,
                constraint=one_constraint(output_format, forced),
            )
        except Invalid as exc:
            return exc.error

    def to_generation(self, reasoning_available: bool, tools_available: bool = False) -> GenerationRequest:
        """The dialect-free request; thinking is honored only where a reasoning channel exists
        (elsewhere it is a no-op, so thinking-by-default clients stay usable), and likewise
        tools only where the model has a tool convention (elsewhere the request is plain chat)."""
        system = (Message("system", self.system),) if self.system is not None else ()
        messages, tools, constraint = self.messages, self.tools, self.constraint
        if not tools_available:
            messages, tools = without_tools(messages), ()
            constraint = None if self.forced_call else constraint
        return GenerationRequest(
            messages=(*system, *messages),
            sampling=sampling_overrides(self),
            max_tokens=self.max_tokens,
            stop=self.stop_sequences,
            ignore_eos=self.ignore_eos,
            # A prefilled reply starts with the client's text, not a think block.
            reasoning=self.thinking and reasoning_available and constraint is None and not self.prefill,
            constraint=constraint,
            tools=tools,
            prefill=self.prefill,
            stop_param="stop_sequences",
        )


# -- refused and not-yet-implemented parameters ---------------------------------------------
def refuse_thread(body: dict) -> None:
    """``thread`` (the message-threads beta) asks for server-held conversation state. Answered
    as the real API answers a request threads cannot serve, so the SDK's tool runner resends
    the whole conversation unthreaded; a ``continue`` names a thread this server never holds."""
    thread = body.get("thread")
    if thread is None or thread is False:
        return None
    if not isinstance(thread, dict):
        raise f.wrong_type("thread", "an object", thread)
    if f.string(thread, "type", "thread.type") == "continue":
        previous = f.string(thread, "previous_message_id", "thread.previous_message_id")
        message = f"thread not found for previous_message_id {previous!r}: {THREADS}"
        raise Invalid(ApiError(404, message, "thread", "thread_not_found", detail_code="thread_not_found"))
    code = "thread_unsupported_request"
    raise Invalid(ApiError(400, f"'thread' is not supported: {THREADS}", "thread", code, detail_code=code))


def _parse_thinking(body: dict, name: str) -> bool:
    thinking = f.obj(body, name)
    if thinking is None:
        return False
    kind = f.string(thinking, "type", "thinking.type")
    if kind not in THINKING_TYPES:
        raise f.invalid_value("thinking.type", kind, f"one of {', '.join(THINKING_TYPES)}")
    if kind == "enabled" and f.integer(thinking, "budget_tokens", lo=1) is None:
        raise Invalid(
            bad_request(
                "'thinking.budget_tokens' is required when thinking is enabled",
                "thinking.budget_tokens",
                "missing_required_parameter",
            )
        )
    return kind != "disabled"


# -- system and messages ---------------------------------------------------------------------
def parse_system(value: object, where: str = "system") -> str | None:
    """``system`` (or a system message's content): a string or an array of text blocks."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise f.wrong_type(where, "a string or an array of text blocks", value)
    texts = []
    for i, block in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(block, dict):
            raise f.wrong_type(at, "an object", block)
        kind = f.string(block, "type", f"{at}.type")
        if kind != "text":
            raise f.invalid_value(f"{at}.type", kind, "'text'")
        text = _text_of(block, at)
        if not text.startswith(CLIENT_METADATA_PREFIX):
            texts.append(text)
    return BLOCK_SEPARATOR.join(texts)


def parse_messages(value: object) -> tuple[tuple[Message, ...], str]:
    """``messages`` as typed messages, and the prefill: the text of a final assistant message,
    which the reply continues (as with Anthropic's own API). A message left empty by dropping
    its thinking blocks is dropped whole."""
    items = f.message_array(value)
    turns = [_parse_message(item, f"messages[{i}]") for i, item in enumerate(items)]
    prefill = ""
    if turns[-1] and turns[-1][-1].role == "assistant":
        prefill = _prefill_text(turns[-1].pop(), f"messages[{len(items) - 1}]")
    return tuple(turn for message_turns in turns for turn in message_turns), prefill


def _prefill_text(last: Message, where: str) -> str:
    """A final assistant message as the text the reply continues; Anthropic refuses trailing
    whitespace there (the continuation would start mid-token), and so do we."""
    if last.tool_calls:
        raise Invalid(
            bad_request(
                f"'{where}' ends the conversation with tool_use blocks, which need tool_result blocks "
                "in a user message after them",
                f"{where}.content",
            )
        )
    if last.content != last.content.rstrip():
        raise Invalid(
            bad_request("final assistant content cannot end with trailing whitespace", f"{where}.content")
        )
    return last.content


def _parse_message(item: object, where: str) -> list[Message]:
    """One message as turns: a user message's tool results come first as tool messages; an
    assistant turn carries its tool_use blocks as calls."""
    if not isinstance(item, dict):
        raise f.wrong_type(where, "an object", item)
    role = f.string(item, "role", f"{where}.role")
    if role not in ROLES:
        raise f.invalid_value(f"{where}.role", role, "'user', 'assistant' or 'system'")
    content = item.get("content")
    if isinstance(content, str):
        return [Message(role, content)]
    if content is None:
        raise Invalid(
            bad_request(f"'{where}.content' is required", f"{where}.content", "missing_required_parameter")
        )
    if not isinstance(content, list):
        raise f.wrong_type(f"{where}.content", "a string or an array of content blocks", content)
    if role == "system":
        return [Message(role, parse_system(content, f"{where}.content"))]
    texts, calls, results = [], [], []
    for j, block in enumerate(content):
        _route_block(block, f"{where}.content[{j}]", role, (texts, calls, results))
    if role == "assistant":
        turn = Message(role, BLOCK_SEPARATOR.join(texts), tool_calls=tuple(calls))
        return [turn] if texts or calls or not content else []
    text_turn = [Message(role, BLOCK_SEPARATOR.join(texts))] if texts or not content else []
    return results + text_turn


def _route_block(block: object, at: str, role: str, into: tuple[list, list, list]) -> None:
    """File a block's text, call (tool_use) or result (tool_result); thinking is dropped."""
    texts, calls, results = into
    if not isinstance(block, dict):
        raise f.wrong_type(at, "an object", block)
    kind = f.string(block, "type", f"{at}.type")
    expected = "tool_use" if role == "assistant" else "tool_result"
    if kind == "text":
        texts.append(_text_of(block, at))
    elif kind in DROPPED_BLOCKS:
        return
    elif kind in MEDIA_BLOCKS:
        raise Invalid(unsupported(f"{at}.type", f"{kind!r}: {MEDIA_BLOCKS[kind]} is not supported"))
    elif kind in ("tool_use", "tool_result") and kind != expected:
        raise Invalid(
            bad_request(f"'{at}': a {kind} block does not belong in a {role} message", f"{at}.type")
        )
    elif kind == "tool_use":
        calls.append(tool_use_call(block, at))
    elif kind == "tool_result":
        results.append(tool_result_message(block, at))
    elif kind is not None and _is_server_tool_block(kind):
        raise Invalid(unsupported(f"{at}.type", f"{kind!r}: server tools are not supported"))
    else:
        raise f.invalid_value(f"{at}.type", kind, "'text'")


def _is_server_tool_block(kind: str) -> bool:
    return kind == "server_tool_use" or kind.endswith("_tool_result") or kind.startswith(SERVER_TOOL_PREFIXES)


def _text_of(block: dict, at: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise f.wrong_type(f"{at}.text", "a string", text)
    return text
