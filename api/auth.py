"""API-key check (``--api-key``): ``Authorization: Bearer KEY`` or ``x-api-key: KEY``."""

from __future__ import annotations

import hmac

from .errors import ApiError


def presented_keys(headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    """Every key the request offers, from either header."""
    keys = []
    for name, value in headers:
        name = name.lower()
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer":
                keys.append(token.strip())
        elif name == b"x-api-key":
            keys.append(value.strip())
    return keys


def check_api_key(expected: str | None, headers: list[tuple[bytes, bytes]]) -> ApiError | None:
    """None when no key is configured or a presented key matches (constant-time), else a 401."""
    if not expected:
        return None
    want = expected.encode()
    keys = presented_keys(headers)
    # Compare against every presented key without stopping early, so timing reveals nothing.
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(key, want)
    if matched:
        return None
    message = (
        "invalid API key" if keys else "missing API key: send 'Authorization: Bearer KEY' or 'x-api-key'"
    )
    return ApiError(401, message, None, "invalid_api_key")
