"""Responses tools: ``tools``, ``tool_choice`` and the call / call-output history items.

Client-run tools are served: flat ``function`` declarations, ``custom`` (free-form) tools
whose input is text in an optional Lark or regex grammar, and either kind grouped in a
``namespace``. The model sees each as a function (a custom tool as one taking a single
``input`` string, a namespaced one as ``namespace.name``); its calls go back to the client as
``function_call`` or ``custom_tool_call`` items under the name and namespace it declared. A
tool choice that forces one custom tool makes the whole reply its input, constrained by the
tool's grammar through llguidance. Hosted tools (``web_search``, ``file_search``,
``local_shell``, ``image_generation``, ...) need a service this server does not run: they
are left out of the prompt, and a tool choice that forces one is a 400. History items fold
into the assistant ``tool_calls`` and ``tool`` messages chat templates render.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from api.errors import bad_request, unsupported
from inference.generation.constraints import ConstraintSpec
from inference.generation.toolcall import ToolCall, ToolSpec
from inference.types import Message

from .. import fields as f
from ..common import call_from
from ..fields import Invalid
from ..tools import forced_call, function_spec, named_tools

CHOICE_WORDS = ("auto", "none", "required")
CLIENT_TOOL_KINDS = ("function", "custom")
NAMESPACE_SEPARATOR = "."  # a namespaced tool's name as the model sees it: "namespace.name"
CUSTOM_INPUT = "input"  # the one argument a custom tool takes, as the model sees it
GRAMMAR_SYNTAXES = ("lark", "regex")
# Tools OpenAI runs (or that need its services): declared by clients such as Codex CLI, never
# callable here. Dated variants ("web_search_2025_08_26") share their family's prefix.
HOSTED_TOOL_PREFIXES = (
    "web_search",
    "file_search",
    "computer",
    "mcp",
    "code_interpreter",
    "image_generation",
    "local_shell",
    "shell",
    "apply_patch",
    "tool_search",
)


@dataclass(frozen=True)
class ResponsesTool:
    """One client-run tool: as the client declared it and as the model sees it (``spec``)."""

    kind: Literal["function", "custom"]
    name: str
    spec: ToolSpec
    namespace: str | None = None
    input_format: ConstraintSpec | None = None  # a custom tool's grammar, enforced when forced
    declaration: dict | None = None  # a custom tool's declaration, echoed as it came

    @property
    def item_type(self) -> str:
        """The output item type of a call to this tool."""
        return "custom_tool_call" if self.kind == "custom" else "function_call"

    def content_of(self, call: ToolCall) -> str:
        """What the call carries: a custom tool's input text, a function's arguments."""
        return custom_input(call) if self.kind == "custom" else call.arguments

    def call_fields(self, content: str) -> dict:
        """The output item fields of a call to this tool carrying ``content``."""
        fields: dict = {"name": self.name}
        if self.namespace is not None:
            fields["namespace"] = self.namespace
        return {**fields, ("input" if self.kind == "custom" else "arguments"): content}


@dataclass(frozen=True)
class ResponsesTools:
    """A request's declared tools: the client-run ones, and the declarations echoed back."""

    client: tuple[ResponsesTool, ...] = ()
    echo: tuple[dict, ...] = ()  # every declaration in the Response object's ``tools`` shape

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(tool.spec for tool in self.client)

    def by_model_name(self, name: str) -> ResponsesTool | None:
        return next((tool for tool in self.client if tool.spec.name == name), None)


@dataclass(frozen=True)
class ToolChoice:
    """What ``tool_choice`` leaves the model: its tools, and a constraint when it forces a call
    (``forced_custom``: the reply is that custom tool's input)."""

    tools: tuple[ToolSpec, ...]
    constraint: ConstraintSpec | None = None
    forced_custom: ResponsesTool | None = None


def custom_input(call: ToolCall) -> str:
    """A custom tool call's input text (the model writes it as the one ``input`` argument)."""
    value = json.loads(call.arguments).get(CUSTOM_INPUT, "")
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


# -- declarations ----------------------------------------------------------------------------
def parse_responses_tools(body: dict) -> ResponsesTools:
    """``tools``: client-run declarations (namespaces opened) and the echo of every one."""
    client: list[ResponsesTool] = []
    echo: list[dict] = []
    for i, tool in enumerate(f.array(body, "tools") or []):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise f.wrong_type(where, "an object", tool)
        kind = f.string(tool, "type", f"{where}.type")
        if kind in CLIENT_TOOL_KINDS:
            declared = _client_tool(tool, where, namespace=None)
            client.append(declared)
            echo.append(_echo(declared))
        elif kind == "namespace":
            members = _namespace(tool, where)
            client.extend(members)
            echo.append({**tool, "tools": [_echo(member) for member in members]})
        elif kind is not None and kind.startswith(HOSTED_TOOL_PREFIXES):
            echo.append(tool)  # not in the prompt; a tool_choice that forces it is a 400
        else:
            expected = "'function', 'custom', 'namespace' or a hosted tool type"
            raise f.invalid_value(f"{where}.type", kind, expected)
    _check_unique(client)
    return ResponsesTools(tuple(client), tuple(echo))


def _namespace(tool: dict, where: str) -> list[ResponsesTool]:
    name = f.string(tool, "name", f"{where}.name")
    if not name:
        raise Invalid(
            bad_request(f"'{where}.name' is required", f"{where}.name", "missing_required_parameter")
        )
    members = []
    for j, member in enumerate(f.array(tool, "tools", f"{where}.tools") or []):
        at = f"{where}.tools[{j}]"
        if not isinstance(member, dict):
            raise f.wrong_type(at, "an object", member)
        kind = f.string(member, "type", f"{at}.type")
        if kind not in CLIENT_TOOL_KINDS:
            raise f.invalid_value(f"{at}.type", kind, "'function' or 'custom'")
        members.append(_client_tool(member, at, namespace=name))
    return members


def _client_tool(tool: dict, where: str, namespace: str | None) -> ResponsesTool:
    declared = function_spec(tool, where) if tool.get("type") == "function" else _custom_spec(tool, where)
    seen_as = declared.name if namespace is None else f"{namespace}{NAMESPACE_SEPARATOR}{declared.name}"
    spec = ToolSpec(seen_as, declared.description, declared.parameters, declared.strict)
    if tool.get("type") == "function":
        return ResponsesTool("function", declared.name, spec, namespace)
    input_format = _custom_format(tool, where)
    return ResponsesTool("custom", declared.name, spec, namespace, input_format, declaration=tool)


def _custom_spec(tool: dict, where: str) -> ToolSpec:
    """A custom tool as the function the model sees: one ``input`` string, its grammar (if
    any) quoted in the description so the model knows the language it writes."""
    name = f.string(tool, "name", f"{where}.name")
    if not name:
        raise Invalid(
            bad_request(f"'{where}.name' is required", f"{where}.name", "missing_required_parameter")
        )
    description = f.string(tool, "description", f"{where}.description") or ""
    grammar = _custom_format(tool, where)
    if grammar is not None:
        description += f"\nThe input is text in this {grammar.kind} grammar:\n{grammar.source}"
    parameters = {
        "type": "object",
        "properties": {CUSTOM_INPUT: {"type": "string", "description": "the tool's free-form input"}},
        "required": [CUSTOM_INPUT],
    }
    return ToolSpec(name, description.strip(), parameters)


def _custom_format(tool: dict, where: str) -> ConstraintSpec | None:
    """A custom tool's ``format``: free text (None) or a Lark / regex grammar."""
    fmt = f.obj(tool, "format", f"{where}.format")
    if fmt is None:
        return None
    kind = f.string(fmt, "type", f"{where}.format.type")
    if kind == "text":
        return None
    if kind != "grammar":
        raise f.invalid_value(f"{where}.format.type", kind, "'text' or 'grammar'")
    syntax = f.string(fmt, "syntax", f"{where}.format.syntax")
    if syntax not in GRAMMAR_SYNTAXES:
        raise f.invalid_value(f"{where}.format.syntax", syntax, "'lark' or 'regex'")
    definition = f.string(fmt, "definition", f"{where}.format.definition")
    if not definition:
        param = f"{where}.format.definition"
        raise Invalid(bad_request(f"'{param}' is required", param, "missing_required_parameter"))
    return ConstraintSpec(syntax, definition, f"{where}.format.definition")


def _echo(tool: ResponsesTool) -> dict:
    """A client tool as the Response object lists it."""
    if tool.kind == "custom":
        return tool.declaration
    spec = tool.spec
    return {
        "type": "function",
        "name": tool.name,
        "description": spec.description,
        "parameters": spec.parameters,
        "strict": spec.strict,
    }


def _check_unique(tools: list[ResponsesTool]) -> None:
    seen: set[str] = set()
    for tool in tools:
        if tool.spec.name in seen:
            message = f"tool names must be unique: {tool.spec.name!r} is declared twice"
            raise Invalid(bad_request(message, "tools"))
        seen.add(tool.spec.name)


# -- tool_choice -----------------------------------------------------------------------------
def parse_responses_tool_choice(body: dict, tools: ResponsesTools) -> ToolChoice:
    """The tools the model sees and the constraint a forcing choice sets. A named choice is
    ``{"type": "function" | "custom", "name": ...}``; naming a hosted tool is a 400."""
    choice = body.get("tool_choice")
    specs = tools.specs
    if choice in (None, "auto"):
        return ToolChoice(specs)
    if choice == "none":
        return ToolChoice(())
    if choice == "required":
        return ToolChoice(specs, forced_call(specs, "required", enforce_schemas=False))
    if not isinstance(choice, dict):
        raise f.invalid_value("tool_choice", choice, ", ".join(CHOICE_WORDS))
    kind = f.string(choice, "type", "tool_choice.type")
    if kind not in CLIENT_TOOL_KINDS:
        raise Invalid(unsupported("tool_choice.type", f"{kind!r} names a hosted tool; this server runs none"))
    name = f.string(choice, "name", "tool_choice.name")
    namespace = f.string(choice, "namespace", "tool_choice.namespace")
    seen_as = name if namespace is None else f"{namespace}{NAMESPACE_SEPARATOR}{name}"
    (spec,) = named_tools(tuple(t.spec for t in tools.client if t.kind == kind), seen_as)
    if kind == "function":
        return ToolChoice(specs, forced_call((spec,), "required", enforce_schemas=False))
    custom = tools.by_model_name(spec.name)
    constraint = custom.input_format
    if constraint is not None:
        constraint = ConstraintSpec(constraint.kind, constraint.source, "tool_choice")
    return ToolChoice(specs, constraint, forced_custom=custom)


# -- history items ---------------------------------------------------------------------------
def model_name(item: dict, where: str) -> str:
    """A replayed call's tool name as the model saw it (``namespace.name`` when namespaced)."""
    name = f.string(item, "name", f"{where}.name")
    namespace = f.string(item, "namespace", f"{where}.namespace")
    return name if namespace is None or name is None else f"{namespace}{NAMESPACE_SEPARATOR}{name}"


def function_call_message(item: dict, where: str) -> Message:
    """A ``function_call`` item as an assistant turn holding that one call."""
    name = model_name(item, where)
    f.string(item, "call_id", f"{where}.call_id")
    call = call_from(name, item.get("arguments", "{}"), as_string=True, as_object=False)
    if call is None:
        raise Invalid(bad_request(f"'{where}' needs a name and JSON object arguments (a string)", where))
    return Message("assistant", "", tool_calls=(call,))


def custom_call_message(item: dict, where: str) -> Message:
    """A ``custom_tool_call`` item as an assistant turn calling the tool with its input."""
    name = model_name(item, where)
    f.string(item, "call_id", f"{where}.call_id")
    text = f.string(item, "input", f"{where}.input")
    if not name or text is None:
        param = f"{where}.name" if not name else f"{where}.input"
        raise Invalid(
            bad_request(
                f"'{where}' needs a 'name' and an 'input' string", param, "missing_required_parameter"
            )
        )
    call = ToolCall(name, json.dumps({CUSTOM_INPUT: text}, ensure_ascii=False))
    return Message("assistant", "", tool_calls=(call,))


def call_output_message(item: dict, where: str) -> Message:
    """A ``function_call_output`` or ``custom_tool_call_output`` item as a tool message
    (output a string or text parts)."""
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
