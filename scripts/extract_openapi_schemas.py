"""Extract the component schemas the shape tests validate against from OpenAI's published
OpenAPI document (github.com/openai/openai-openapi, ``openapi.json``), so the test runs offline.

    python scripts/extract_openapi_schemas.py path/to/openapi.json --commit <sha> [--out FILE]

Keeps the roots below and every schema they reference, drops prose (descriptions, examples,
``x-`` extensions) and translates OpenAPI 3.0's ``nullable: true`` into JSON Schema (the
document mixes it with 3.1's ``type: [..., "null"]``). The result keeps the document's layout
(``components.schemas``), so its ``$ref`` s resolve unchanged, and records where it came from.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOTS = (
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "Response",
    "ResponseStreamEvent",
    "ErrorResponse",
)
SOURCE = "https://github.com/openai/openai-openapi/blob/{commit}/openapi.json"
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "openai_openapi_schemas.json"
PROSE = ("description", "example", "examples", "title", "deprecated")
REF_PREFIX = "#/components/schemas/"


def referenced(schema: object) -> set[str]:
    """The component names a schema refers to."""
    found: set[str] = set()
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith(REF_PREFIX):
            found.add(ref[len(REF_PREFIX) :])
        for value in schema.values():
            found |= referenced(value)
    elif isinstance(schema, list):
        for value in schema:
            found |= referenced(value)
    return found


def closure(schemas: dict, roots: tuple[str, ...]) -> list[str]:
    """The roots and every component reachable from them, sorted."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        if name not in schemas:
            raise SystemExit(f"component {name!r} is not in the document")
        seen.add(name)
        todo.extend(referenced(schemas[name]) - seen)
    return sorted(seen)


def to_json_schema(node: object) -> object:
    """``node`` without prose and extensions, ``nullable: true`` made JSON Schema."""
    if isinstance(node, list):
        return [to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        key: to_json_schema(value)
        for key, value in node.items()
        if key not in PROSE and not key.startswith("x-") and key not in ("nullable", "discriminator")
    }
    if node.get("nullable") is True:
        out = _nullable(out)
    return out


def _nullable(schema: dict) -> dict:
    kind = schema.get("type")
    if isinstance(kind, str) and "enum" not in schema:
        return {**schema, "type": [kind, "null"]}
    if isinstance(kind, list) and "enum" not in schema:
        return {**schema, "type": sorted(set(kind) | {"null"})}
    return {"anyOf": [schema, {"type": "null"}]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("document", type=Path, help="openapi.json from openai/openai-openapi")
    parser.add_argument("--commit", required=True, help="the openai-openapi commit it was taken from")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    document = json.loads(args.document.read_text())
    schemas = document["components"]["schemas"]
    names = closure(schemas, ROOTS)
    fixture = {
        "source": SOURCE.format(commit=args.commit),
        "commit": args.commit,
        "openapi": document.get("openapi"),
        "api_version": document.get("info", {}).get("version"),
        "roots": list(ROOTS),
        "components": {"schemas": {name: to_json_schema(schemas[name]) for name in names}},
    }
    args.out.write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
    print(f"{len(names)} schemas -> {args.out} ({args.out.stat().st_size} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
