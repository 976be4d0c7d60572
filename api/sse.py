"""Server-sent events framing."""

from __future__ import annotations

import json

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # reverse proxies must not hold frames back
]


def _json(payload: dict) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def data_frame(payload: dict | str) -> bytes:
    """A ``data:``-only frame; a dict is sent as compact JSON (non-ASCII kept as UTF-8)."""
    text = payload if isinstance(payload, str) else _json(payload)
    return f"data: {text}\n\n".encode()


def event_frame(event: str, payload: dict) -> bytes:
    """A named frame (``event:`` + ``data:``), as the Responses and Messages streams use."""
    return f"event: {event}\ndata: {_json(payload)}\n\n".encode()
