"""Chat Completions function calling: ``tools``, ``tool_choice`` and assistant ``tool_calls``."""

from __future__ import annotations

from api.errors import bad_request
from inference.generation.toolcall import ToolCall, ToolSpec

from .. import fields as f
from ..common import call_from
from ..fields import Invalid
from ..tools import ToolsAndConstraint, function_spec, parse_function_tool_choice, parse_tools


def parse_chat_tools(body: dict) -> tuple[ToolSpec, ...]:
    """``tools``: function declarations ``{"type": "function", "function": {...}}``."""
    return parse_tools(body, _chat_declaration)


def _chat_declaration(tool: dict, where: str) -> ToolSpec:
    kind = f.string(tool, "type", f"{where}.type")
    if kind != "function":
        raise f.invalid_value(f"{where}.type", kind)
    function = f.obj(tool, "function", f"{where}.function")
    if function is None:
        raise Invalid(bad_request(f"'{where}.function' is required", f"{where}.function"))
    return function_spec(function, f"{where}.function")


def parse_chat_tool_choice(body: dict, tools: tuple[ToolSpec, ...]) -> ToolsAndConstraint:
    """The tools the model sees and the forced-call constraint; a named choice is
    ``{"type": "function", "function": {"name": ...}}``."""
    return parse_function_tool_choice(body, tools, _chat_choice_name, _bad_chat_choice)


def _chat_choice_name(choice: dict) -> object:
    return (f.obj(choice, "function", "tool_choice.function") or {}).get("name")


def _bad_chat_choice(choice: object) -> Invalid:
    return f.invalid_value("tool_choice", choice)


def parse_tool_calls(item: dict, where: str) -> tuple[ToolCall, ...]:
    """An assistant message's ``tool_calls``, arguments (JSON text or an object) re-serialized
    compactly."""
    calls = f.array(item, "tool_calls", f"{where}.tool_calls") or []
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        function = f.obj(call, "function", f"{at}.function") if isinstance(call, dict) else None
        if function is None:
            raise Invalid(bad_request(f"'{at}.function' is required", f"{at}.function"))
        name = f.string(function, "name", f"{at}.function.name")
        parsed = call_from(name, function.get("arguments", "{}"), as_string=True, as_object=True)
        if parsed is None:
            raise Invalid(
                bad_request(f"'{at}.function' needs a name and JSON object arguments", f"{at}.function")
            )
        out.append(parsed)
    return tuple(out)
