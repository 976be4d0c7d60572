"""Schemathesis hooks for the live fuzz (tests/api/test_openapi_fuzz.py), loaded by the ``st``
CLI through ``SCHEMATHESIS_HOOKS``: every error must come in its dialect's envelope."""

from __future__ import annotations

import schemathesis


@schemathesis.check
def dialect_error_envelope(ctx, response, case):
    """A 4xx or 5xx answer carries Anthropic's envelope on the Messages endpoints and OpenAI's
    everywhere else, with a non-empty message."""
    if response.status_code < 400:
        return None
    body = response.json()
    anthropic = case.operation.path.startswith("/v1/messages")
    if anthropic:
        assert body.get("type") == "error", f"not Anthropic's error envelope: {body}"
    error = body.get("error")
    assert isinstance(error, dict), f"no error object: {body}"
    assert isinstance(error.get("message"), str) and error["message"], f"no error message: {body}"
    assert isinstance(error.get("type"), str) and error["type"], f"no error type: {body}"
    if not anthropic:
        assert {"param", "code"} <= set(error), f"not OpenAI's error envelope: {body}"
    return None
