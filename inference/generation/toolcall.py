"""Function calls written as a JSON object between a family's markers (its
:class:`~inference.engine.families.ToolConvention`; Hermes' ``<tool_call>{"name": ...,
"arguments": {...}}</tool_call>`` for the qwen2 and qwen3 families).

:class:`ToolCallScanner` captures call regions in a reply's text as it streams: plain text
passes through at once (except what may be the start of a marker), each call is reported as
soon as its closing marker arrives, and a region whose JSON is not a call passes through as
plain text, markers intact; a reply that is exactly one call written without the markers
(bare JSON or a fenced json block) is a call too. :func:`forced_call_grammar` compiles "the
reply is exactly one call to one of these tools" into a Lark grammar for llguidance, its
argument numbers digit-bounded like a ``response_format`` schema's.
"""

from __future__ import annotations

import json

from inference.engine.families import ToolConvention
from inference.generation.constraints import ConstraintSpec, bound_number_digits
from inference.types import PERMISSIVE_ARGUMENTS, ToolCall, ToolSpec

__all__ = ["PERMISSIVE_ARGUMENTS", "ToolCall", "ToolSpec"]  # defined with the request (inference.types)

FENCE = "```"
FENCE_OPENERS = ("```", "```json")
# A call's arguments are laid out as Hermes' examples and json.dumps lay them out, with no other
# whitespace: with llguidance's flexible default a small model can pad a call with spaces and
# newlines until its budget runs out (Qwen2.5-0.5B did, for 30 minutes, under Claude Code).
CALL_JSON_OPTIONS = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
# Whitespace allowed between a call's closing marker and the next call or the end of the reply.
BETWEEN_CALLS = "/[ \\t\\n]{0,4}/"
# The grammar of a non-enforced tool's arguments: any JSON object, spelled out as a recursive
# schema because llguidance's own "any value" has open numbers, which the digit bounds cannot reach.
ANY_OBJECT_ARGUMENTS = {
    "$defs": {
        "value": {
            "anyOf": [
                {"type": ["null", "boolean", "string"]},
                {"type": "number"},
                {"type": "array", "items": {"$ref": "#/$defs/value"}},
                {"type": "object", "additionalProperties": {"$ref": "#/$defs/value"}},
            ]
        }
    },
    "type": "object",
    "additionalProperties": {"$ref": "#/$defs/value"},
}


# A scanner item and where it ends in the scanner's input (ToolCallScanner.feed_spans).
Span = tuple[str | ToolCall, int]


def parse_call(body: str) -> ToolCall | None:
    """The call a region's JSON describes, or None when it is not a well-formed call."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def bare_call(text: str) -> ToolCall | None:
    """The call a whole reply makes without its markers: exactly one ``{"name": ...,
    "arguments": {...}}`` object, bare or in a fenced json block (small models often drop
    the tags; llama.cpp's Hermes parser accepts these too). None for anything else."""
    body = text.strip()
    if body.startswith(FENCE):
        first_line, _, rest = body.partition("\n")
        if first_line.strip() not in FENCE_OPENERS or not rest.rstrip().endswith(FENCE):
            return None
        body = rest.rstrip()[: -len(FENCE)]
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or set(value) != {"name", "arguments"}:
        return None  # a JSON answer that merely has a "name" is not a call
    return parse_call(body)


def _may_be_bare_call(lead: str) -> bool | None:
    """Whether a reply opening as ``lead`` may still be a bare call (None: too early to say)."""
    body = lead.lstrip()
    if not body or (FENCE.startswith(body) and len(body) < len(FENCE)):
        return None
    if body.startswith("{"):
        return True
    if not body.startswith(FENCE):
        return False
    first_line, newline, _ = body.partition("\n")
    return None if not newline else first_line.strip() in FENCE_OPENERS


class ToolCallScanner:
    """Splits streamed reply text into plain text and completed :class:`ToolCall` s. A reply
    that opens like a bare call (``{`` or a json fence) is held whole and becomes a call if it
    is exactly one call to a ``declared`` tool (:func:`bare_call`), else plain text: a client
    handed a call to a tool it never declared fails the turn (Codex CLI exits 1 on one), where
    the same JSON as text ends the turn as an answer."""

    def __init__(self, convention: ToolConvention, declared: frozenset[str] | None = None):
        self.open, self.close = convention.open, convention.close
        self.declared = declared  # the tools a bare call may name; None: any
        self._held = ""  # text that may start a call marker
        self._region: list[str] | None = None  # the text inside an open call region
        self._lead: str | None = ""  # the reply's opening while it may be a bare call
        self.fed = 0  # characters fed so far: the coordinates of the spans' ends

    def feed(self, text: str) -> list[str | ToolCall]:
        """Route more text; returns the text pieces and calls that can be sent now, in order."""
        return [item for item, _ in self.feed_spans(text)]

    def flush(self) -> list[str | ToolCall]:
        """The reply ended: a held opening is a bare call or plain text; an unclosed region
        passes through as plain text."""
        return [item for item, _ in self.flush_spans()]

    def feed_spans(self, text: str) -> list[Span]:
        """:meth:`feed`, each item with where it ends in the text fed so far (a text piece is
        that text's characters ``[end - len(piece), end)``; a call ends after its closing
        marker), so a caller can tell which input characters each piece carries."""
        self.fed += len(text)
        if self._lead is not None:
            self._lead += text
            verdict = _may_be_bare_call(self._lead)
            if verdict is not False:
                return []  # held: undecided yet, or a bare call candidate (decided at the end)
            text, self._lead = self._lead, None
        return self._scan(text)

    def _scan(self, text: str) -> list[Span]:
        out: list[Span] = []
        text = self._held + text
        self._held = ""
        while text:
            if self._region is None:
                text = self._scan_plain(text, out)
            else:
                text = self._scan_region(text, out)
        return out

    def flush_spans(self) -> list[Span]:
        """:meth:`flush` with the items' ends (see :meth:`feed_spans`)."""
        if self._lead is not None:
            lead, self._lead = self._lead, None
            call = bare_call(lead)
            if call is not None and (self.declared is None or call.name in self.declared):
                return [(call, self.fed)]
            return self._scan(lead) + self.flush_spans()
        out: list[Span] = []
        if self._region is not None:
            out.append((self.open + "".join(self._region) + self._held, self.fed))
        elif self._held:
            out.append((self._held, self.fed))
        self._region, self._held = None, ""
        return out

    def _scan_plain(self, text: str, out: list) -> str:
        at = text.find(self.open)
        if at < 0:
            keep = _marker_prefix(text, self.open)
            self._held = text[len(text) - keep :] if keep else ""
            _emit(out, text[: len(text) - keep], self.fed - keep)
            return ""
        _emit(out, text[:at], self.fed - len(text) + at)
        self._region = []
        return text[at + len(self.open) :]

    def _scan_region(self, text: str, out: list) -> str:
        at = text.find(self.close)
        if at < 0:
            keep = _marker_prefix(text, self.close)
            self._region.append(text[: len(text) - keep])
            self._held = text[len(text) - keep :] if keep else ""
            return ""
        body = "".join(self._region) + text[:at]
        self._region = None
        call = parse_call(body)
        end = self.fed - len(text) + at + len(self.close)
        out.append((call if call is not None else self.open + body + self.close, end))
        return text[at + len(self.close) :]


def _emit(out: list, text: str, end: int) -> None:
    if text:
        out.append((text, end))


def _marker_prefix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    return next((n for n in range(min(len(marker) - 1, len(text)), 0, -1) if text.endswith(marker[:n])), 0)


def forced_call_grammar(tools: list[ToolSpec], enforce_schemas: bool, convention: ToolConvention) -> str:
    """A Lark grammar whose only sentences are one call to one of ``tools``, written in the
    family's ``convention``. Argument schemas are enforced for tools that are ``strict`` or when
    ``enforce_schemas``; others get any JSON object. Open numbers have bounded digits
    (:func:`bound_number_digits`), so greedy decoding cannot loop inside one."""
    if not tools:
        raise ValueError("a forced call needs at least one tool")
    opener, closer = json.dumps(convention.open + chr(10)), json.dumps(chr(10) + convention.close)
    rules = [f"start: {opener} call {closer}", *_call_rules(tools, enforce_schemas)]
    return "\n".join(rules) + "\n"


def auto_call_grammar(tools: list[ToolSpec], convention: ToolConvention) -> str:
    """A Lark grammar for a reply that may call ``tools`` (tool_choice auto): any text, or text
    that opens the family's call marker and then makes one or more well-formed calls to
    declared tools, as llama.cpp's lazy tool grammars do. Until the marker, nothing is
    constrained; after it, the name must be a declared one and the arguments must match its
    schema (any JSON object for a tool without one), so a small model cannot call a tool that
    does not exist, leave out a required argument or leave a call unparseable."""
    if not tools:
        raise ValueError("a call grammar needs at least one tool")
    opener, closer = json.dumps(convention.open), json.dumps(chr(10) + convention.close)
    rules = [
        "start: TEXT | text call_body more_calls",
        f"text[suffix={opener}]: /(?s:.*)/",
        "TEXT: /(?s:.*)/",
        f"more_calls: (SPACE {opener} call_body)* SPACE",
        f"SPACE: {BETWEEN_CALLS}",
        f'call_body: "\\n" call {closer}',
        *_call_rules(tools, enforce_schemas=True),
    ]
    return "\n".join(rules) + "\n"


def _call_rules(tools: list[ToolSpec], enforce_schemas: bool) -> list[str]:
    """``call``: one ``{"name": ..., "arguments": {...}}`` object naming one of ``tools``."""
    rules = ["call: " + " | ".join(f"call_{i}" for i in range(len(tools)))]
    for i, tool in enumerate(tools):
        head = json.dumps('{"name": ' + json.dumps(tool.name) + ', "arguments": ')
        rules.append(f'call_{i}: {head} args_{i} "}}"')
        enforce = (enforce_schemas or tool.strict) and tool.parameters is not None
        schema = bound_number_digits(tool.parameters if enforce else ANY_OBJECT_ARGUMENTS)
        rules.append(f"args_{i}: %json {json.dumps({**schema, 'x-guidance': CALL_JSON_OPTIONS})}")
    return rules


def forced_call_spec(
    tools: list[ToolSpec], enforce_schemas: bool, param: str = "tool_choice"
) -> ConstraintSpec:
    """The constraint "the reply is exactly one call to one of ``tools``", before the loaded
    family's convention is known (the dialects parse it; the backend resolves it with
    :func:`resolve_forced_call`)."""
    if not tools:
        raise ValueError("a forced call needs at least one tool")
    payload = {
        "tools": [[tool.name, tool.description, tool.parameters, tool.strict] for tool in tools],
        "enforce_schemas": enforce_schemas,
    }
    return ConstraintSpec("tool_call", json.dumps(payload), param)


def resolve_forced_call(spec: ConstraintSpec, convention: ToolConvention | None) -> ConstraintSpec:
    """``spec`` with a forced call turned into the Lark grammar of ``convention``; any other
    constraint as it is."""
    if spec.kind != "tool_call":
        return spec
    if convention is None:
        raise ValueError("a forced call needs a model with a function-calling convention")
    payload = json.loads(spec.source)
    tools = [ToolSpec(*fields) for fields in payload["tools"]]
    grammar = forced_call_grammar(tools, payload["enforce_schemas"], convention)
    return ConstraintSpec("lark", grammar, spec.param)
