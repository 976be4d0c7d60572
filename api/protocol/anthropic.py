"""Anthropic Messages: request validation onto the dialect-free GenerationRequest.

A translation layer over the same normalized request as the OpenAI dialects. Honored: system
(a string or text blocks), messages with text blocks (earlier thinking / redacted_thinking
blocks are dropped, like replayed reasoning items), temperature, top_p, top_k, the required
max_tokens, stop_sequences, stream and thinking (enabled / adaptive switch the reasoning
channel on where the model has one; a no-op elsewhere). metadata and service_tier are
ignored. Images, documents and server tools are refused (400); client tools, tool_choice and
structured output are 501 until constrained decoding lands. The encoders live in
:mod:`api.protocol.anthropic_encoder`.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.errors import ApiError, bad_request, not_implemented, unsupported
from inference.types import GenerationRequest, Message, SamplingOverrides

from . import fields as f
from .fields import Invalid

ROLES = ("user", "assistant")
DROPPED_BLOCKS = ("thinking", "redacted_thinking")  # earlier reasoning never reaches the prompt
MEDIA_BLOCKS = {"image": "image input", "document": "document input", "search_result": "search results"}
TOOL_BLOCKS = ("tool_use", "tool_result")  # client tool history: lands with tool calling
SERVER_TOOL_PREFIXES = ("web_search", "web_fetch", "code_execution", "mcp_", "tool_search")
THINKING_TYPES = ("enabled", "adaptive", "disabled")
BLOCK_SEPARATOR = "\n"  # text blocks are separate pieces of text: never glue words together


@dataclass(frozen=True)
class MessagesRequest:
    """A validated request; fields in the order of Anthropic's reference, then our extension."""

    max_tokens: int | None  # required on /v1/messages; count_tokens has none
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

    @classmethod
    def parse(cls, body: dict, *, count_only: bool = False) -> MessagesRequest | ApiError:
        """Validate a decoded JSON object (a count_tokens body when ``count_only``: no
        max_tokens, no sampling); the first problem found is returned as an ApiError."""
        try:
            _refuse_unsupported(body)
            max_tokens = None if count_only else f.integer(body, "max_tokens", lo=1)
            if max_tokens is None and not count_only:
                raise Invalid(
                    bad_request("'max_tokens' is required", "max_tokens", "missing_required_parameter")
                )
            return cls(
                max_tokens=max_tokens,
                messages=parse_messages(body.get("messages")),
                model=f.string(body, "model"),
                stop_sequences=_parse_stop_sequences(body.get("stop_sequences")),
                stream=bool(f.boolean(body, "stream")),
                system=parse_system(body.get("system")),
                temperature=f.number(body, "temperature", 0.0, 1.0),
                thinking=_parse_thinking(body),
                top_k=f.integer(body, "top_k", lo=0),
                top_p=f.number(body, "top_p", 0.0, 1.0),
                ignore_eos=bool(f.boolean(body, "ignore_eos")),
            )
        except Invalid as exc:
            return exc.error

    def to_generation(self, reasoning_available: bool) -> GenerationRequest:
        """The dialect-free request; thinking is honored only where a reasoning channel exists
        (elsewhere it is a no-op, so thinking-by-default clients stay usable)."""
        system = (Message("system", self.system),) if self.system is not None else ()
        sampling = SamplingOverrides(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        return GenerationRequest(
            (*system, *self.messages),
            sampling,
            self.max_tokens,
            self.stop_sequences,
            self.ignore_eos,
            reasoning=self.thinking and reasoning_available,
        )


# -- refused and not-yet-implemented parameters ---------------------------------------------
def _refuse_unsupported(body: dict) -> None:
    if f.array(body, "mcp_servers"):
        raise Invalid(unsupported("mcp_servers", "(server-side MCP tools) is not supported"))
    if body.get("container") is not None:
        raise Invalid(unsupported("container", "(server-side code execution) is not supported"))
    tools = f.array(body, "tools") or []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise f.wrong_type(f"tools[{i}]", "an object", tool)
        kind = tool.get("type")
        if isinstance(kind, str) and kind.startswith(SERVER_TOOL_PREFIXES):
            raise Invalid(
                unsupported(f"tools[{i}].type", f"{kind!r} is a server tool; this server runs no tools")
            )
    if tools:
        raise Invalid(not_implemented("tools"))
    tool_choice = f.obj(body, "tool_choice")
    if tool_choice is not None and tool_choice.get("type") not in ("auto", "none"):
        raise Invalid(not_implemented("tool_choice"))
    output_config = f.obj(body, "output_config")
    if output_config is not None and output_config.get("format") is not None:
        raise Invalid(not_implemented("output_config.format"))
    if body.get("output_format") is not None:
        raise Invalid(not_implemented("output_format"))


def _parse_thinking(body: dict) -> bool:
    thinking = f.obj(body, "thinking")
    if thinking is None:
        return False
    kind = thinking.get("type")
    if kind not in THINKING_TYPES:
        raise Invalid(
            bad_request(
                f"Invalid value for 'thinking.type': {kind!r}; expected one of {', '.join(THINKING_TYPES)}",
                "thinking.type",
            )
        )
    if kind == "enabled" and f.integer(thinking, "budget_tokens", lo=1) is None:
        raise Invalid(
            bad_request(
                "'thinking.budget_tokens' is required when thinking is enabled",
                "thinking.budget_tokens",
                "missing_required_parameter",
            )
        )
    return kind != "disabled"


def _parse_stop_sequences(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise f.wrong_type("stop_sequences", "an array of strings", value)
    if any(s == "" for s in value):
        raise Invalid(bad_request("'stop_sequences' must not contain empty strings", "stop_sequences"))
    return tuple(value)


# -- system and messages ---------------------------------------------------------------------
def parse_system(value: object) -> str | None:
    """``system``: a string or an array of text blocks."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise f.wrong_type("system", "a string or an array of text blocks", value)
    texts = []
    for i, block in enumerate(value):
        at = f"system[{i}]"
        if not isinstance(block, dict):
            raise f.wrong_type(at, "an object", block)
        kind = block.get("type")
        if kind != "text":
            message = f"Invalid value for '{at}.type': {kind!r}; expected 'text'"
            raise Invalid(bad_request(message, f"{at}.type"))
        texts.append(_text_of(block, at))
    return BLOCK_SEPARATOR.join(texts)


def parse_messages(value: object) -> tuple[Message, ...]:
    """``messages`` as typed messages. A message left empty by dropping its thinking blocks is
    dropped whole; a final assistant message (a prefill) is not implemented."""
    if value is None:
        raise Invalid(bad_request("'messages' is required", "messages", "missing_required_parameter"))
    if not isinstance(value, list):
        raise f.wrong_type("messages", "an array", value)
    if not value:
        raise Invalid(bad_request("'messages' must contain at least one message", "messages"))
    parsed = [_parse_message(item, f"messages[{i}]") for i, item in enumerate(value)]
    if parsed[-1] is not None and parsed[-1].role == "assistant":
        last = f"messages[{len(value) - 1}]"
        raise Invalid(
            unsupported(
                last,
                "is an assistant message: continuing a prefilled reply is not implemented by this "
                "server yet; end with a user message",
                status=501,
            )
        )
    return tuple(m for m in parsed if m is not None)


def _parse_message(item: object, where: str) -> Message | None:
    if not isinstance(item, dict):
        raise f.wrong_type(where, "an object", item)
    role = item.get("role")
    if role not in ROLES:
        raise Invalid(
            bad_request(
                f"Invalid value for '{where}.role': {role!r}; expected 'user' or 'assistant'", f"{where}.role"
            )
        )
    content = item.get("content")
    if isinstance(content, str):
        return Message(role, content)
    if content is None:
        raise Invalid(
            bad_request(f"'{where}.content' is required", f"{where}.content", "missing_required_parameter")
        )
    if not isinstance(content, list):
        raise f.wrong_type(f"{where}.content", "a string or an array of content blocks", content)
    texts = [_block_text(block, f"{where}.content[{j}]") for j, block in enumerate(content)]
    kept = [text for text in texts if text is not None]
    return Message(role, BLOCK_SEPARATOR.join(kept)) if kept or not content else None


def _block_text(block: object, at: str) -> str | None:
    """A content block's text; None for a dropped (thinking) block."""
    if not isinstance(block, dict):
        raise f.wrong_type(at, "an object", block)
    kind = block.get("type")
    if kind == "text":
        return _text_of(block, at)
    if kind in DROPPED_BLOCKS:
        return None
    if kind in MEDIA_BLOCKS:
        raise Invalid(unsupported(f"{at}.type", f"{kind!r}: {MEDIA_BLOCKS[kind]} is not supported"))
    if kind in TOOL_BLOCKS:
        raise Invalid(not_implemented(f"{at}.type"))
    if isinstance(kind, str) and _is_server_tool_block(kind):
        raise Invalid(unsupported(f"{at}.type", f"{kind!r}: server tools are not supported"))
    raise Invalid(bad_request(f"Invalid value for '{at}.type': {kind!r}; expected 'text'", f"{at}.type"))


def _is_server_tool_block(kind: str) -> bool:
    return kind == "server_tool_use" or kind.endswith("_tool_result") or kind.startswith(SERVER_TOOL_PREFIXES)


def _text_of(block: dict, at: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise f.wrong_type(f"{at}.text", "a string", text)
    return text
