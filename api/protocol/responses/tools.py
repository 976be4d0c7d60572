"""Responses function calling: ``tools``, ``tool_choice`` and the ``function_call`` /
``function_call_output`` history items.

Declarations are flat (``{"type": "function", "name", "parameters", ...}``); a forced choice
becomes the same forced call as on Chat Completions. History items fold into the
assistant ``tool_calls`` and ``tool`` messages chat templates render.
"""

from __future__ import annotations

from api.errors import bad_request, not_implemented, unsupported
from inference.generation.toolcall import ToolSpec
from inference.types import Message

from .. import fields as f
from ..common import call_from
from ..fields import Invalid
from ..tools import ToolsAndConstraint, function_spec, parse_function_tool_choice, parse_tools

CHOICE_WORDS = ("auto", "none", "required")


def parse_responses_tools(body: dict) -> tuple[ToolSpec, ...]:
    """``tools``: flat function declarations; hosted tools are a 400, ``custom`` (free-form) a 501."""
    return parse_tools(body, _responses_declaration)


def _responses_declaration(tool: dict, where: str) -> ToolSpec:
    kind = f.string(tool, "type", f"{where}.type")
    if kind == "custom":
        raise Invalid(not_implemented(f"{where}.type"))
    if kind != "function":
        raise Invalid(unsupported(f"{where}.type", f"{kind!r} is a hosted tool; this server runs no tools"))
    return function_spec(tool, where)


def parse_responses_tool_choice(body: dict, tools: tuple[ToolSpec, ...]) -> ToolsAndConstraint:
    """The tools the model sees and the forced-call constraint; a named choice is
    ``{"type": "function", "name": ...}``."""
    return parse_function_tool_choice(body, tools, _responses_choice_name, _bad_responses_choice)


def _responses_choice_name(choice: dict) -> object:
    return f.string(choice, "name", "tool_choice.name")


def _bad_responses_choice(choice: object) -> Invalid:
    if isinstance(choice, dict):
        kind = f.string(choice, "type", "tool_choice.type")
        return Invalid(
            unsupported("tool_choice.type", f"{kind!r} names a hosted tool; this server runs none")
        )
    return f.invalid_value("tool_choice", choice, ", ".join(CHOICE_WORDS))


def function_call_message(item: dict, where: str) -> Message:
    """A ``function_call`` item as an assistant turn holding that one call."""
    name = f.string(item, "name", f"{where}.name")
    f.string(item, "call_id", f"{where}.call_id")
    call = call_from(name, item.get("arguments", "{}"), as_string=True, as_object=False)
    if call is None:
        raise Invalid(bad_request(f"'{where}' needs a name and JSON object arguments (a string)", where))
    return Message("assistant", "", tool_calls=(call,))


def function_output_message(item: dict, where: str) -> Message:
    """A ``function_call_output`` item as a tool message (output a string or text parts)."""
    call_id = f.string(item, "call_id", f"{where}.call_id")
    output = item.get("output")
    if isinstance(output, list):
        texts = [part.get("text") for part in output if isinstance(part, dict)]
        if len(texts) != len(output) or not all(isinstance(t, str) for t in texts):
            raise f.wrong_type(f"{where}.output", "a string or an array of text parts", output)
        output = "".join(texts)
    if not isinstance(output, str):
        raise f.wrong_type(f"{where}.output", "a string", output)
    return Message("tool", output, tool_call_id=call_id)


def merge_call_turns(messages: list[Message]) -> tuple[Message, ...]:
    """Consecutive assistant turns carrying calls become one turn (text first, then all calls),
    the shape a model produced them in."""
    merged: list[Message] = []
    for message in messages:
        last = merged[-1] if merged else None
        if message.tool_calls and last is not None and last.role == "assistant":
            content = last.content + message.content
            merged[-1] = Message("assistant", content, tool_calls=last.tool_calls + message.tool_calls)
        else:
            merged.append(message)
    return tuple(merged)


def tools_echo(tools: tuple[ToolSpec, ...]) -> list[dict]:
    """The declarations as a Response object lists them."""
    return [
        {
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
            "strict": tool.strict,
        }
        for tool in tools
    ]
