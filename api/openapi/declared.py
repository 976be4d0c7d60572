"""Request schemas built from a dialect's field declarations (api/protocol/request_fields.py).

A field's kind gives its schema (type, range, enumeration, nullability); a structured field
(kind Shape) takes the shape its dialect's module here gives by the field's name. A refused
field is declared with what still passes (``x-lmserve-refused``), an ignored one as accepted
and not read (``x-lmserve-ignored``), as shapes.py describes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from api.protocol.request_fields import (
    Anything,
    Choice,
    Flag,
    Integer,
    Kind,
    Nothing,
    RequestField,
    Sampling,
    Shape,
    StopStrings,
    Text,
)

from .shapes import Schema, any_of, array, boolean, enum, ignored, in_range, integer, obj, refused, string


def _stop_strings(kind: StopStrings, description: str | None) -> Schema:
    bounds = {"maxItems": kind.limit} if kind.limit is not None else {}
    if not kind.single:
        return array(string(nullable=False, minLength=1), description, **bounds)
    strings = array(string(nullable=False, minLength=1), **bounds)
    return any_of(string(nullable=True, minLength=1), strings, description=description)


def _kind_schema(kind: Kind, description: str | None, nullable: bool) -> Schema:
    match kind:
        case Text():
            return string(description, nullable=nullable)
        case Flag():
            return boolean(description, nullable=nullable)
        case Integer(lo=lo, hi=hi):
            return integer(lo=lo, hi=hi, description=description, nullable=nullable)
        case Sampling(allowed=allowed):
            return in_range(allowed, description)
        case Choice(values=values):
            return enum(values, description, nullable=nullable)
        case StopStrings():
            return _stop_strings(kind, description)
        case Nothing():
            return {"type": "null"}
        case Anything():
            return {}
    raise TypeError(f"no schema for {kind!r}")


def field_schema(field: RequestField, shape: Schema | None = None) -> Schema:
    """A field's schema; ``shape`` is a structured field's (required for kind Shape, and only
    for it)."""
    if isinstance(field.kind, Shape) != (shape is not None):
        raise ValueError(f"{field.name!r}: a shape goes with kind Shape, and only with it")
    if field.refused is not None:
        return refused(field.refused, shape if shape is not None else _kind_schema(field.kind, None, True))
    if shape is not None:
        return shape
    if field.ignored:
        return ignored(_kind_schema(field.kind, None, True), field.description or "accepted and ignored")
    return _kind_schema(field.kind, field.description, not field.required)


def request_schema(
    declared: Iterable[RequestField], shapes: Mapping[str, Schema], description: str
) -> Schema:
    """A request body's schema from its declaration: one property per declared field, in
    order, ``shapes`` giving the structured ones by name (each used, none missing)."""
    declared = tuple(declared)
    unused = set(shapes) - {field.name for field in declared if isinstance(field.kind, Shape)}
    if unused:
        raise ValueError(f"shapes for fields that are not declared as structured: {sorted(unused)}")
    properties = {field.name: field_schema(field, shapes.get(field.name)) for field in declared}
    required = tuple(field.name for field in declared if field.required)
    return obj(properties, required, description)
