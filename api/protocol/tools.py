"""Chat Completions function calling: ``tools``, ``tool_choice`` and assistant ``tool_calls``.

Declarations become ToolSpecs; a forced ``tool_choice`` ("required" or a named function)
becomes a constraint over the Hermes call shape, so the reply is exactly one valid call.
"""

from __future__ import annotations

import json

from api.errors import bad_request
from inference.constraints import ConstraintSpec
from inference.toolcall import ToolCall, ToolSpec, forced_call_grammar

from . import fields as f
from .fields import Invalid


def parse_chat_tools(body: dict) -> tuple[ToolSpec, ...]:
    """``tools``: function declarations ``{"type": "function", "function": {...}}``."""
    tools = f.array(body, "tools") or []
    specs = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise f.wrong_type(where, "an object", tool)
        if tool.get("type") != "function":
            raise Invalid(
                bad_request(f"Invalid value for '{where}.type': {tool.get('type')!r}", f"{where}.type")
            )
        function = f.obj(tool, "function", f"{where}.function")
        if function is None:
            raise Invalid(bad_request(f"'{where}.function' is required", f"{where}.function"))
        specs.append(function_spec(function, f"{where}.function"))
    return tuple(specs)


def function_spec(function: dict, where: str) -> ToolSpec:
    """One ``{"name", "description", "parameters", "strict"}`` declaration."""
    name = f.string(function, "name", f"{where}.name")
    if not name:
        raise Invalid(
            bad_request(f"'{where}.name' is required", f"{where}.name", "missing_required_parameter")
        )
    parameters = f.obj(function, "parameters", f"{where}.parameters")
    return ToolSpec(
        name=name,
        description=f.string(function, "description", f"{where}.description") or "",
        parameters=parameters,
        strict=bool(f.boolean(function, "strict", f"{where}.strict")),
    )


def parse_chat_tool_choice(
    body: dict, tools: tuple[ToolSpec, ...]
) -> tuple[tuple[ToolSpec, ...], ConstraintSpec | None]:
    """The tools the model sees and the forced-call constraint, if the choice forces one."""
    choice = body.get("tool_choice")
    if choice in (None, "auto"):
        return tools, None
    if choice == "none":
        return (), None
    if choice == "required":
        candidates = tools
    elif isinstance(choice, dict) and choice.get("type") == "function":
        name = (f.obj(choice, "function", "tool_choice.function") or {}).get("name")
        candidates = tuple(tool for tool in tools if tool.name == name)
        if not candidates:
            raise Invalid(bad_request(f"tool_choice names {name!r}, which is not in 'tools'", "tool_choice"))
    else:
        raise Invalid(bad_request(f"Invalid value for 'tool_choice': {choice!r}", "tool_choice"))
    if not candidates:
        raise Invalid(bad_request("tool_choice 'required' needs at least one tool in 'tools'", "tool_choice"))
    return tools, ConstraintSpec("lark", forced_call_grammar(list(candidates), False), "tool_choice")


def parse_tool_calls(item: dict, where: str) -> tuple[ToolCall, ...]:
    """An assistant message's ``tool_calls``, arguments re-serialized compactly."""
    calls = f.array(item, "tool_calls", f"{where}.tool_calls") or []
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        function = f.obj(call, "function", f"{at}.function") if isinstance(call, dict) else None
        if function is None:
            raise Invalid(bad_request(f"'{at}.function' is required", f"{at}.function"))
        name = f.string(function, "name", f"{at}.function.name")
        arguments = function.get("arguments", "{}")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            parsed = None
        if not name or not isinstance(parsed, dict):
            raise Invalid(
                bad_request(f"'{at}.function' needs a name and JSON object arguments", f"{at}.function")
            )
        out.append(ToolCall(name, json.dumps(parsed, ensure_ascii=False)))
    return tuple(out)
