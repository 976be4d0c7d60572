"""API errors as values: a status code, a message, the offending parameter.

Every failure a client can see is an :class:`ApiError`; each dialect renders it in its own
envelope: OpenAI's ``{"error": {message, type, param, code}}``, or Anthropic's
``{"type": "error", "error": {type, message}}`` with the type derived from the same status.
Status codes are real: the SDKs dispatch on them.
"""

from __future__ import annotations

from dataclasses import dataclass

from inference.types import ContextOverflow, Error

# OpenAI's error "type" per status (the SDKs read the status; humans read the type).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    501: "not_implemented_error",
    503: "service_unavailable_error",
}

# Anthropic's error "type" per status; other 4xx are invalid_request_error, other 5xx api_error.
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def is_anthropic_client(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether an Anthropic client sent the request (it always carries ``anthropic-version``)."""
    return any(name.lower() == b"anthropic-version" for name, _ in headers)


def wants_anthropic_errors(path: str, headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request's errors use the Anthropic envelope: on the Messages endpoints, and on
    any request an Anthropic client sent."""
    relative = path.strip("/").removeprefix("v1/")
    if relative == "messages" or relative.startswith("messages/"):
        return True
    return is_anthropic_client(headers)


@dataclass(frozen=True)
class ApiError:
    """A failed request, whatever the dialect."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    retry_after: int | None = None
    allow: tuple[str, ...] = ()  # for 405: the methods the endpoint accepts
    overflow: ContextOverflow | None = None  # a prompt too long for the context
    detail_code: str | None = None  # Anthropic's machine-readable error.details.error_code

    @property
    def type(self) -> str:
        return ERROR_TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")

    @classmethod
    def from_event(cls, error: Error) -> ApiError:
        return cls(
            error.status, error.message, error.param, error.code, error.retry_after, overflow=error.overflow
        )

    def headers(self) -> list[tuple[bytes, bytes]]:
        """Extra response headers this error carries."""
        out = []
        if self.retry_after is not None:
            out.append((b"retry-after", str(self.retry_after).encode()))
        if self.allow:
            out.append((b"allow", ", ".join(self.allow).encode()))
        return out

    def openai_payload(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    @property
    def anthropic_type(self) -> str:
        fallback = "api_error" if self.status >= 500 else "invalid_request_error"
        return ANTHROPIC_ERROR_TYPES.get(self.status, fallback)

    def anthropic_payload(self) -> dict:
        """Anthropic's envelope; a context overflow in the wording Anthropic clients parse
        (Claude Code compacts on it)."""
        message = self.message
        if self.overflow is not None:
            overflow = self.overflow
            message = f"prompt is too long: {overflow.prompt_tokens} tokens > {overflow.n_ctx} maximum"
        error = {"type": self.anthropic_type, "message": message}
        if self.detail_code is not None:
            error["details"] = {"error_code": self.detail_code}
        return {"type": "error", "error": error}


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param, code)


def unsupported(param: str, why: str = "is not supported by this server", status: int = 400) -> ApiError:
    """A parameter we refuse rather than silently ignore."""
    return ApiError(status, f"'{param}' {why}", param, "unsupported_parameter")


def not_implemented(param: str) -> ApiError:
    return unsupported(param, "is not implemented by this server yet", status=501)


def not_found(message: str, code: str = "not_found") -> ApiError:
    return ApiError(404, message, None, code)
