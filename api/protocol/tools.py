"""Function calling: the declaration and ``tool_choice`` parsers every dialect shares (each
dialect's own shapes live in its folder's ``tools.py``).

The shared parsers take a dialect's shape as small adapters (how one declaration reads, where
a named choice keeps its name). Declarations become ToolSpecs; a forcing ``tool_choice``
becomes a forced-call constraint (spelled in the loaded family's call convention by the
backend), so the reply is exactly one valid call.
"""

from __future__ import annotations

from collections.abc import Callable

from api.errors import bad_request
from inference.generation.constraints import ConstraintSpec
from inference.generation.toolcall import ToolSpec, forced_call_spec

from . import fields as f
from .fields import Invalid

ToolsAndConstraint = tuple[tuple[ToolSpec, ...], ConstraintSpec | None]


# -- shared by the dialects ------------------------------------------------------------------
def parse_tools(body: dict, declaration: Callable[[dict, str], ToolSpec]) -> tuple[ToolSpec, ...]:
    """``tools`` as ToolSpecs; ``declaration`` reads one object (at ``tools[i]``) in the
    dialect's shape, or raises Invalid for a kind of tool it refuses."""
    specs = []
    for i, tool in enumerate(f.array(body, "tools") or []):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise f.wrong_type(where, "an object", tool)
        specs.append(declaration(tool, where))
    return tuple(specs)


def parse_function_tool_choice(
    body: dict,
    tools: tuple[ToolSpec, ...],
    choice_name: Callable[[dict], object],
    bad_choice: Callable[[object], Invalid],
) -> ToolsAndConstraint:
    """The OpenAI dialects' ``tool_choice`` ("auto", "none", "required" or a named function):
    the tools the model sees and the forced-call constraint, if the choice forces one.
    ``choice_name`` finds the name in a ``{"type": "function", ...}`` choice; ``bad_choice`` is
    the error for any other value."""
    choice = body.get("tool_choice")
    if choice in (None, "auto"):
        return tools, None
    if choice == "none":
        return (), None
    if choice == "required":
        return tools, forced_call(tools, "required", enforce_schemas=False)
    if isinstance(choice, dict) and choice.get("type") == "function":
        return tools, forced_call(named_tools(tools, choice_name(choice)), "required", enforce_schemas=False)
    raise bad_choice(choice)


def named_tools(tools: tuple[ToolSpec, ...], name: object) -> tuple[ToolSpec, ...]:
    """The declared tool a choice names; a name not in ``tools`` is a 400."""
    candidates = tuple(tool for tool in tools if tool.name == name)
    if not candidates:
        raise Invalid(bad_request(f"tool_choice names {name!r}, which is not in 'tools'", "tool_choice"))
    return candidates


def forced_call(candidates: tuple[ToolSpec, ...], choice: str, enforce_schemas: bool) -> ConstraintSpec:
    """The constraint that makes the reply exactly one call to one of ``candidates``; forcing a
    call with no tool to call is a 400 that quotes the ``choice``."""
    if not candidates:
        raise Invalid(
            bad_request(f"tool_choice {choice!r} needs at least one tool in 'tools'", "tool_choice")
        )
    return forced_call_spec(list(candidates), enforce_schemas, "tool_choice")


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
