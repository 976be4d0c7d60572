"""Typed reads of JSON request fields, each failure a 400 that names the parameter.

Readers raise :class:`Invalid`; the dialect parsers catch it once and return the ApiError as
a value. ``bool`` is never accepted where a number is wanted (JSON true is not 1).
"""

from __future__ import annotations

import json
from typing import Any

from api.errors import ApiError, bad_request, unsupported
from inference.types import SamplingRange


class Invalid(Exception):
    """A request field is wrong; carries the error to answer with."""

    def __init__(self, error: ApiError):
        super().__init__(error.message)
        self.error = error


def json_type(value: Any) -> str:
    """The JSON name of a value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def wrong_type(param: str, expected: str, value: Any) -> Invalid:
    return Invalid(
        bad_request(
            f"Invalid type for '{param}': expected {expected}, but got {json_type(value)}.",
            param,
            "invalid_type",
        )
    )


def invalid_value(param: str, value: Any, expected: str | None = None) -> Invalid:
    """A value outside what ``param`` accepts; ``expected`` says what it does accept."""
    message = f"Invalid value for '{param}': {value!r}" + (f"; expected {expected}" if expected else "")
    return Invalid(bad_request(message, param))


def out_of_range(param: str, value: Any, bounds: str) -> Invalid:
    return Invalid(bad_request(f"Invalid value for '{param}': {value!r} is not {bounds}.", param))


def parse_json_object(body: bytes) -> dict | ApiError:
    """The request body as a JSON object; anything else is a 400 (never a 500)."""
    if not body.strip():
        return bad_request("the request body is empty; expected a JSON object", None, "invalid_json")
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return bad_request(f"the request body is not valid JSON: {exc}", None, "invalid_json")
    if not isinstance(value, dict):
        return bad_request(
            f"the request body must be a JSON object, not {json_type(value)}", None, "invalid_json"
        )
    where = lone_surrogate_at(value)
    if where is not None:
        message = (
            f"Invalid value for '{where}': the text holds a lone UTF-16 surrogate (an unpaired "
            "\\ud800-\\udfff escape or its raw bytes), which is not a Unicode character"
        )
        return bad_request(message, where, "invalid_unicode")
    return value


def lone_surrogate_at(value: Any, path: str = "") -> str | None:
    """The path (``messages[0].content``) of the first string, or key, holding a lone surrogate:
    json.loads lets them through (escaped, or as raw bytes via surrogatepass), but no text
    encoder downstream accepts them."""
    if isinstance(value, str):
        return path if not _encodable(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            inner = f"{path}.{key}" if path else str(key)
            if not _encodable(key):
                return path or "(a key)"
            found = lone_surrogate_at(item, inner)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = lone_surrogate_at(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def number(body: dict, name: str, allowed: SamplingRange) -> float | None:
    """A number within ``allowed``; None when absent or null."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise wrong_type(name, "a number", value)
    if not allowed.admits(value):
        raise out_of_range(name, value, f"a number {allowed.wording()}")
    return float(value)


def integer(body: dict, name: str, lo: int | None = None, hi: int | None = None) -> int | None:
    """An integer (a float with no fraction counts) within the given bounds; None when absent."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong_type(name, "an integer", value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        low = "" if lo is None else f" >= {lo}"
        high = "" if hi is None else f" <= {hi}"
        raise out_of_range(name, value, "an integer" + low + (" and" if low and high else "") + high)
    return value


def boolean(body: dict, name: str, param: str | None = None) -> bool | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise wrong_type(param or name, "a boolean", value)
    return value


def string(body: dict, name: str, param: str | None = None) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise wrong_type(param or name, "a string", value)
    return value


def obj(body: dict, name: str, param: str | None = None) -> dict | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise wrong_type(param or name, "an object", value)
    return value


def array(body: dict, name: str, param: str | None = None) -> list | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, list):
        raise wrong_type(param or name, "an array", value)
    return value


def message_array(value: object) -> list:
    """``messages``: required, an array, and not empty."""
    if value is None:
        raise Invalid(bad_request("'messages' is required", "messages", "missing_required_parameter"))
    if not isinstance(value, list):
        raise wrong_type("messages", "an array", value)
    if not value:
        raise Invalid(bad_request("'messages' must contain at least one message", "messages"))
    return value


def text_content(
    content: object, where: str, text_keys: dict[str, str], expected: str, refused: dict[str, str]
) -> str:
    """A message's content, a string or an array of text parts, as one string.

    ``text_keys`` maps each accepted part type to the key holding its text; part types in
    ``refused`` (images, audio, files) are a 400 naming what is not supported."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise wrong_type(where, "a string or an array of content parts", content)
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise wrong_type(at, "an object", part)
        kind = string(part, "type", f"{at}.type")
        if kind in refused:
            raise Invalid(unsupported(f"{at}.type", f"{kind!r}: {refused[kind]} is not supported"))
        key = text_keys.get(kind)
        if key is None:
            raise invalid_value(f"{at}.type", kind, f"'{expected}'")
        text = part.get(key)
        if not isinstance(text, str):
            raise wrong_type(f"{at}.{key}", "a string", text)
        texts.append(text)
    return "".join(texts)


def parse_stop_strings(
    value: object, param: str, *, single: bool, limit: int | None = None
) -> tuple[str, ...]:
    """Stop strings: an array of non-empty strings (or, when ``single``, one string), at most
    ``limit`` of them."""
    if value is None:
        return ()
    stops = [value] if single and isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        expected = "a string or an array of strings" if single else "an array of strings"
        raise wrong_type(param, expected, value)
    if limit is not None and len(stops) > limit:
        raise Invalid(bad_request(f"'{param}' allows at most {limit} strings, got {len(stops)}", param))
    if any(s == "" for s in stops):
        raise Invalid(bad_request(f"'{param}' must not contain empty strings", param))
    return tuple(stops)
