"""One declaration per request field, from which both the parser and the OpenAPI document come.

A dialect lists its top-level fields as a tuple of :class:`RequestField`, in the order of its
official reference and then our extensions. :func:`read_fields` reads a body through that
tuple (every failure an :class:`~api.protocol.fields.Invalid` naming the parameter, as the
typed readers of :mod:`api.protocol.fields` raise), and api/openapi/ builds the request's
schema from the same tuple, so a field's name, type, range, description and whether it is
required, refused or ignored are written once.

What a kind cannot say stays code: a structured field (messages, tools, a reply format) is
read by the dialect's own parser and described by a shape in api/openapi/, and checks across
fields (tool_choice against tools, top_logprobs against logprobs) follow the declarative read
in each dialect's ``parse``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from api.errors import bad_request, unsupported
from inference.types import SamplingRange

from . import fields as f
from .fields import Invalid

# A field's reader: the whole body and the field's name in, the typed value out (or Invalid).
Reader = Callable[[dict, str], Any]


# -- kinds: the JSON type of a field, which gives both its reader and its schema ----------------
@dataclass(frozen=True)
class Text:
    """A string; absent or null reads as ``default``."""

    default: str | None = None

    def read(self, body: dict, name: str) -> str | None:
        value = f.string(body, name)
        return self.default if value is None else value


@dataclass(frozen=True)
class Flag:
    """A boolean; absent or null reads as ``default``."""

    default: bool = False

    def read(self, body: dict, name: str) -> bool:
        value = f.boolean(body, name)
        return self.default if value is None else value


@dataclass(frozen=True)
class Integer:
    """An integer within ``lo``..``hi`` (either may be open)."""

    lo: int | None = None
    hi: int | None = None

    def read(self, body: dict, name: str) -> int | None:
        return f.integer(body, name, lo=self.lo, hi=self.hi)


@dataclass(frozen=True)
class Sampling:
    """A sampling field: an integer or a number within ``allowed`` (from SAMPLING_RANGES)."""

    allowed: SamplingRange

    def read(self, body: dict, name: str) -> int | float | None:
        if self.allowed.integer:
            return f.integer(body, name, lo=self.allowed.lowest, hi=self.allowed.highest)
        return f.number(body, name, self.allowed)


@dataclass(frozen=True)
class Choice:
    """One of a few strings, or of booleans (a refused flag: the one value that still passes)."""

    values: tuple[str, ...] | tuple[bool, ...]

    def read(self, body: dict, name: str) -> str | bool | None:
        booleans = isinstance(self.values[0], bool)
        value = f.boolean(body, name) if booleans else f.string(body, name)
        if value is not None and value not in self.values:
            shown = ", ".join(str(v).lower() if booleans else str(v) for v in self.values)
            raise f.invalid_value(name, value, f"one of {shown}")
        return value


@dataclass(frozen=True)
class StopStrings:
    """Stop strings: an array of non-empty strings (or one string, when ``single``), at most
    ``limit`` of them."""

    single: bool
    limit: int | None = None

    def read(self, body: dict, name: str) -> tuple[str, ...]:
        return f.parse_stop_strings(body.get(name), name, single=self.single, limit=self.limit)


@dataclass(frozen=True)
class Nothing:
    """Only null passes: a refused field any value of which is refused."""

    def read(self, body: dict, name: str) -> None:
        return None


@dataclass(frozen=True)
class Anything:
    """Any JSON value: an ignored field whose type nobody checks."""

    def read(self, body: dict, name: str) -> Any:
        return body.get(name)


@dataclass(frozen=True)
class Shape:
    """A structure (an array of messages, a tool, a format object): read by the field's own
    reader, and described by a shape the OpenAPI module gives by the field's name."""

    def read(self, body: dict, name: str) -> Any:
        raise TypeError(f"the structured field {name!r} needs a reader of its own")


def as_sent(body: dict, name: str) -> Any:
    """The reader of a field checked only with another one (tool_choice, against the tools, by
    the dialect's ``parse``; /infill's max_tokens, by n_predict's reader): its value as sent."""
    return body.get(name)


Kind = Text | Flag | Integer | Sampling | Choice | StopStrings | Nothing | Anything | Shape


# -- fields ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RequestField:
    """A top-level field of a request body.

    Its value becomes the request's attribute of the same name, unless it is ``combined`` (the
    dialect's ``parse`` combines it with others: tools with tool_choice, a format with the
    regex extension), ``refused`` (read only to refuse what this server cannot do; the text
    says what, for the document) or ``ignored`` (accepted and never read).
    """

    name: str  # the JSON name
    kind: Kind
    description: str | None = None
    required: bool = False
    read: Reader | None = None  # the dialect's reader, where the kind's own is not the whole story
    combined: bool = False
    refused: str | None = None
    ignored: bool = False

    def value(self, body: dict) -> Any:
        """The field's value in ``body``, read and checked; Invalid names the field."""
        if self.required and body.get(self.name) is None:
            raise Invalid(bad_request(f"'{self.name}' is required", self.name, "missing_required_parameter"))
        return (self.read or self.kind.read)(body, self.name)


class ReadFields:
    """A body read through its dialect's declaration: the values by JSON name."""

    def __init__(self, values: dict[str, Any], attributes: tuple[str, ...]):
        self._values = values
        self._attributes = attributes

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def attributes(self) -> dict[str, Any]:
        """The values that become the request's same-named attributes, as keyword arguments."""
        return {name: self._values[name] for name in self._attributes}


def read_fields(declared: Iterable[RequestField], body: dict) -> ReadFields:
    """Read every declared field of ``body``: the refused ones first (what this server cannot
    do is the first thing to say), then the others in declaration order. Ignored fields are not
    read; the first problem raises Invalid."""
    declared = tuple(declared)
    for field in declared:
        if field.refused is not None:
            field.value(body)
    kept = [field for field in declared if field.refused is None and not field.ignored]
    values = {field.name: field.value(body) for field in kept}
    return ReadFields(values, tuple(field.name for field in kept if not field.combined))


# -- readers of refused fields -------------------------------------------------------------------
def refuse_any(why: str) -> Reader:
    """A reader refusing any value but null: ``'<name>' <why>``."""

    def read(body: dict, name: str) -> None:
        if body.get(name) is not None:
            raise Invalid(unsupported(name, why))

    return read


def refuse_non_empty(kind: Callable[[dict, str, str | None], Any], why: str | None = None) -> Reader:
    """A reader refusing a non-empty value (an object or an array, read by ``kind``: f.obj,
    f.array); an empty one, or null, passes."""

    def read(body: dict, name: str) -> None:
        if kind(body, name, None):
            raise Invalid(unsupported(name, why) if why else unsupported(name))

    return read
