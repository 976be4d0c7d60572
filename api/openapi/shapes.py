"""JSON Schema (2020-12, as OpenAPI 3.1 uses it) builders for the request declarations.

Optional fields are nullable: every parser reads a JSON null as "absent". Two annotations
tie a declaration to its parser (tests/api/test_openapi_document.py checks both ways):
``x-lmserve-ignored`` marks a field that is accepted and not read, ``x-lmserve-refused`` one
the parser reads only to refuse it (400, or 501 where a later version implements it).
"""

from __future__ import annotations

from typing import Any

from inference.types import SamplingRange

Schema = dict[str, Any]


def _typed(kind: str, nullable: bool, description: str | None, **extra) -> Schema:
    schema: Schema = {"type": [kind, "null"] if nullable else kind, **extra}
    if description:
        schema["description"] = description
    return schema


def string(description: str | None = None, *, nullable: bool = True, **extra) -> Schema:
    return _typed("string", nullable, description, **extra)


def boolean(description: str | None = None, *, nullable: bool = True) -> Schema:
    return _typed("boolean", nullable, description)


def integer(
    lo: int | None = None, hi: int | None = None, description: str | None = None, *, nullable: bool = True
) -> Schema:
    bounds = {k: v for k, v in (("minimum", lo), ("maximum", hi)) if v is not None}
    return _typed("integer", nullable, description, **bounds)


def in_range(allowed: SamplingRange, description: str | None = None) -> Schema:
    """A sampling field: an integer or a number within ``allowed``."""
    if allowed.integer:
        return integer(lo=allowed.lowest, hi=allowed.highest, description=description)
    bounds: Schema = {}
    if allowed.lowest is not None:
        bounds["exclusiveMinimum" if allowed.lowest_excluded else "minimum"] = allowed.lowest
    if allowed.highest is not None:
        bounds["maximum"] = allowed.highest
    return _typed("number", True, description, **bounds)


def array(items: Schema, description: str | None = None, *, nullable: bool = True, **extra) -> Schema:
    return _typed("array", nullable, description, items=items, **extra)


def obj(
    properties: dict[str, Schema],
    required: tuple[str, ...] = (),
    description: str | None = None,
    *,
    nullable: bool = False,
) -> Schema:
    """An object; unknown members are accepted (and ignored), as the parsers do."""
    schema = _typed("object", nullable, description, properties=properties)
    if required:
        schema["required"] = list(required)
    return schema


def enum(values, description: str | None = None, *, nullable: bool = False) -> Schema:
    schema: Schema = {"enum": [*values, None] if nullable else list(values)}
    if description:
        schema["description"] = description
    return schema


def const(value: str) -> Schema:
    return {"const": value}


def any_of(*schemas: Schema, description: str | None = None) -> Schema:
    schema: Schema = {"anyOf": list(schemas)}
    if description:
        schema["description"] = description
    return schema


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def ignored(schema: Schema, why: str = "accepted and ignored") -> Schema:
    return {**schema, "description": why, "x-lmserve-ignored": True}


def refused(why: str, accepted: Schema | None = None) -> Schema:
    """A field read only to refuse it: ``accepted`` is what still passes (its neutral value;
    by default only null), ``why`` says what is refused."""
    return {**(accepted or {"type": "null"}), "description": why, "x-lmserve-refused": True}


def json_schema_object(description: str) -> Schema:
    """A JSON Schema given by the client (an object, or a boolean schema)."""
    return {"type": ["object", "boolean"], "description": description}
