"""Anthropic Messages tool use: ``tools``, ``tool_choice`` and ``tool_use`` / ``tool_result``
history blocks.

Client tools (``{"name", "description", "input_schema"}``) become ToolSpecs; a forced choice
(``any`` or a named ``tool``) becomes a forced call with every input schema enforced.
History blocks fold into assistant ``tool_calls`` and ``tool`` messages. On a model without a
tool convention, :func:`without_tools` turns a request into plain chat, as Anthropic clients
expect tools to be optional.
"""

from __future__ import annotations

from api.errors import bad_request, unsupported
from inference.generation.toolcall import ToolCall, ToolSpec
from inference.types import Message

from .. import fields as f
from ..common import call_from
from ..fields import Invalid
from ..tools import ToolsAndConstraint, forced_call, named_tools, parse_tools

SERVER_TOOL_PREFIXES = ("web_search", "web_fetch", "code_execution", "mcp_", "tool_search")
CHOICE_TYPES = ("auto", "any", "tool", "none")


def parse_anthropic_tools(body: dict) -> tuple[ToolSpec, ...]:
    """``tools``: client tool declarations; server and Anthropic-defined tools are a 400."""
    return parse_tools(body, _anthropic_declaration)


def _anthropic_declaration(tool: dict, where: str) -> ToolSpec:
    kind = f.string(tool, "type", f"{where}.type")
    if kind is not None and kind.startswith(SERVER_TOOL_PREFIXES):
        raise Invalid(unsupported(f"{where}.type", f"{kind!r} is a server tool; this server runs no tools"))
    if kind not in (None, "custom"):
        raise Invalid(unsupported(f"{where}.type", f"{kind!r}: only custom (client) tools are supported"))
    name = f.string(tool, "name", f"{where}.name")
    schema = f.obj(tool, "input_schema", f"{where}.input_schema")
    if not name or schema is None:
        message = f"'{where}' needs a 'name' and an 'input_schema'"
        raise Invalid(bad_request(message, where, "missing_required_parameter"))
    description = f.string(tool, "description", f"{where}.description") or ""
    strict = bool(f.boolean(tool, "strict", f"{where}.strict"))
    return ToolSpec(name, description, schema, strict)


def parse_anthropic_tool_choice(body: dict, tools: tuple[ToolSpec, ...]) -> ToolsAndConstraint:
    """The tools the model sees and the forced-call constraint (input schemas always enforced)."""
    choice = f.obj(body, "tool_choice")
    kind = f.string(choice, "type", "tool_choice.type") if choice is not None else "auto"
    if kind not in CHOICE_TYPES:
        raise f.invalid_value("tool_choice.type", kind, f"one of {', '.join(CHOICE_TYPES)}")
    if kind == "auto":
        return tools, None
    if kind == "none":
        return (), None
    candidates = named_tools(tools, f.string(choice, "name", "tool_choice.name")) if kind == "tool" else tools
    return tools, forced_call(candidates, kind, enforce_schemas=True)


def tool_use_call(block: dict, at: str) -> ToolCall:
    """A ``tool_use`` block of an assistant turn as the call it made."""
    name = f.string(block, "name", f"{at}.name")
    f.string(block, "id", f"{at}.id")
    arguments = f.obj(block, "input", f"{at}.input")
    call = call_from(name, arguments, as_string=False, as_object=True)
    if call is None:
        raise Invalid(bad_request(f"'{at}' needs a 'name' and an 'input' object", at))
    return call


def tool_result_message(block: dict, at: str) -> Message:
    """A ``tool_result`` block as a tool message; its content is a string or text blocks."""
    content = block.get("content", "")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise Invalid(unsupported(f"{at}.content[{j}]", "is not a text block: only text results"))
            texts.append(f.string(part, "text", f"{at}.content[{j}].text") or "")
        content = "\n".join(texts)
    if not isinstance(content, str):
        raise f.wrong_type(f"{at}.content", "a string or an array of text blocks", content)
    if f.boolean(block, "is_error", f"{at}.is_error"):
        content = f"Error: {content}"
    return Message("tool", content, tool_call_id=f.string(block, "tool_use_id", f"{at}.tool_use_id"))


def without_tools(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    """Plain chat for a model without a tool convention: calls dropped from assistant turns,
    tool results handed over as user text."""
    plain = []
    for message in messages:
        if message.role == "tool":
            plain.append(Message("user", message.content))
        elif message.tool_calls:
            if message.content:
                plain.append(Message("assistant", message.content))
        else:
            plain.append(message)
    return tuple(plain)


def check_tool_results(items: list) -> None:
    """Every ``tool_result`` answers a ``tool_use`` of the message just before it, as the real
    API requires: a result without its call (a history cut short, or a threaded turn sent to a
    stateless server) is a 400 rather than a reply made without the call in view. ``items``
    are the already validated raw messages."""
    previous: set[str] = set()
    for i, item in enumerate(items):
        blocks = item["content"] if isinstance(item["content"], list) else []
        ids = [block.get("id") for block in blocks if block.get("type") == "tool_use"]
        for j, block in enumerate(blocks):
            if block.get("type") != "tool_result" or block.get("tool_use_id") in previous:
                continue
            at = f"messages[{i}].content[{j}]"
            raise Invalid(
                bad_request(
                    f"'{at}': unexpected tool_use_id {block.get('tool_use_id')!r} in a tool_result block: "
                    "each tool_result must answer a tool_use block of the previous message",
                    f"{at}.tool_use_id",
                )
            )
        previous = set(ids) if item["role"] == "assistant" else set()
