"""Reply-format fields of every dialect, parsed into one ConstraintSpec.

Chat's ``response_format``, Responses' ``text.format`` and Anthropic's ``output_config.format``
(and its older ``output_format``) share the json_schema / json_object / text shapes; the
``regex`` and ``lark`` extensions (llama.cpp precedent) constrain the reply directly. Whether
a grammar compiles is checked later against the model's vocabulary (a 400 either way).
"""

from __future__ import annotations

from api.errors import bad_request
from inference.generation.constraints import ConstraintSpec

from . import fields as f
from .fields import Invalid

JSON_OBJECT_SCHEMA = {"type": "object"}


def parse_format(value: object, param: str) -> ConstraintSpec | None:
    """A ``{"type": "text" | "json_object" | "json_schema", ...}`` format object. The schema
    sits in ``json_schema.schema`` (Chat Completions) or directly in ``schema`` (Responses,
    Anthropic)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise f.wrong_type(param, "an object", value)
    kind = f.string(value, "type", f"{param}.type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ConstraintSpec.json_schema(JSON_OBJECT_SCHEMA, param)
    if kind != "json_schema":
        raise f.invalid_value(f"{param}.type", kind, "'text', 'json_object' or 'json_schema'")
    nested = value.get("json_schema")
    holder, where = (nested, f"{param}.json_schema") if isinstance(nested, dict) else (value, param)
    schema = holder.get("schema")
    if schema is None:
        return ConstraintSpec.json_schema(JSON_OBJECT_SCHEMA, param)  # OpenAI: no schema, any object
    if not isinstance(schema, (dict, bool)):
        raise f.wrong_type(f"{where}.schema", "an object", schema)
    return ConstraintSpec.json_schema(schema, f"{where}.schema")


def parse_extensions(regex: str | None, lark: str | None) -> ConstraintSpec | None:
    """The ``regex`` and ``lark`` extension fields, as read (at most one)."""
    found = [
        ConstraintSpec(kind, text, kind)
        for kind, text in (("regex", regex), ("lark", lark))
        if text is not None
    ]
    if len(found) > 1:
        raise Invalid(bad_request("'regex' and 'lark' cannot be combined", "lark"))
    return found[0] if found else None


def one_constraint(*specs: ConstraintSpec | None) -> ConstraintSpec | None:
    """The request's constraint; two at once (a format and a regex, ...) is a 400."""
    given = [spec for spec in specs if spec is not None]
    if len(given) > 1:
        names = " and ".join(f"'{spec.param}'" for spec in given)
        raise Invalid(bad_request(f"{names} cannot be combined: a reply has one format", given[1].param))
    return given[0] if given else None
