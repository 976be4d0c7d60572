"""Twenty varied JSON schemas for the constrained-output tests, each small enough that a
reply fits a modest token budget (strings and arrays are bounded)."""

from __future__ import annotations


def obj(properties: dict, required: list[str] | None = None) -> dict:
    """A closed object schema; every property required unless told otherwise."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


NAME = {"type": "string", "minLength": 1, "maxLength": 12}
SMALL = {"type": "integer", "minimum": -999, "maximum": 999}
SCHEMAS: list[tuple[str, str, dict]] = [
    (
        "person",
        "Describe a person.",
        obj({"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    ),
    ("flag", "Is the sky blue?", obj({"answer": {"type": "boolean"}})),
    ("color", "Pick a color.", obj({"color": {"enum": ["red", "green", "blue"]}})),
    ("number", "Give a temperature.", obj({"celsius": {"type": "number", "minimum": -50, "maximum": 60}})),
    (
        "tags",
        "List some tags.",
        obj({"tags": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 3}}),
    ),
    ("point", "A 2D point.", obj({"x": SMALL, "y": SMALL})),
    ("nested", "A city and its country.", obj({"city": NAME, "country": obj({"name": NAME, "code": NAME})})),
    (
        "optional",
        "A book.",
        obj(
            {"title": NAME, "year": {"type": "integer", "minimum": 1000, "maximum": 2100}}, required=["title"]
        ),
    ),
    ("nullable", "A middle name if any.", obj({"middle": {"anyOf": [NAME, {"type": "null"}]}})),
    ("const", "Say ok.", obj({"status": {"const": "ok"}, "code": {"type": "integer", "maximum": 999}})),
    ("ints", "Three numbers.", {"type": "array", "items": SMALL, "minItems": 3, "maxItems": 3}),
    ("string", "A greeting.", {"type": "string", "maxLength": 20}),
    ("integer", "A dice roll.", {"type": "integer", "minimum": 1, "maximum": 6}),
    ("pattern", "A time.", obj({"time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"}})),
    ("enum-int", "A rating.", obj({"stars": {"enum": [1, 2, 3, 4, 5]}, "comment": NAME})),
    (
        "items",
        "A shopping list.",
        obj(
            {
                "items": {
                    "type": "array",
                    "items": obj({"what": NAME, "count": {"type": "integer", "minimum": 1, "maximum": 9}}),
                    "maxItems": 2,
                }
            }
        ),
    ),
    ("oneof", "A shape.", {"oneOf": [obj({"circle": SMALL}), obj({"square": SMALL})]}),
    (
        "ref",
        "Two people.",
        {
            **obj({"a": {"$ref": "#/$defs/p"}, "b": {"$ref": "#/$defs/p"}}),
            "$defs": {"p": obj({"name": NAME})},
        },
    ),
    ("bool-array", "Three coin flips.", {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}),
    (
        "mixed",
        "A product.",
        obj(
            {
                "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
                "price": {"type": "number", "minimum": 0, "maximum": 999},
                "stock": {"type": "boolean"},
            }
        ),
    ),
]
