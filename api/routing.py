"""Which ASGI application serves a request.

API endpoints (each with or without the ``/v1`` prefix) go to their consumers; any path
Django's URL conf knows (the admin, pages) and the static files (the admin's CSS and
JavaScript, served by WhiteNoise) go to Django; everything else gets a JSON 404. The whole
application sits behind the Host check (``ALLOWED_HOSTS``) and the ``--conns`` gate.
"""

from __future__ import annotations

import json

from channels.routing import URLRouter
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.urls import Resolver404, re_path, resolve

from inference.model_files import ModelFileError
from inference.runtime import service as services

from . import paths
from .consumers.anthropic import CountTokensConsumer, MessagesConsumer
from .consumers.chat import ChatCompletionsConsumer
from .consumers.completions import CompletionsConsumer
from .consumers.embeddings import EmbeddingsConsumer
from .consumers.infill import InfillConsumer
from .consumers.info import HealthConsumer, ModelConsumer, ModelListConsumer, NotFoundConsumer
from .consumers.metrics import MetricsConsumer
from .consumers.openapi import OpenApiConsumer
from .consumers.responses import ResponsesConsumer
from .consumers.tokenize import DetokenizeConsumer, TokenizerConsumer
from .errors import ApiError, wants_anthropic_errors
from .metrics import RequestMetricsMiddleware

api_urlpatterns = [
    re_path(paths.CHAT_COMPLETIONS, ChatCompletionsConsumer.as_asgi()),
    re_path(paths.COMPLETIONS, CompletionsConsumer.as_asgi()),
    re_path(paths.RESPONSES, ResponsesConsumer.as_asgi()),
    re_path(paths.EMBEDDINGS, EmbeddingsConsumer.as_asgi()),
    re_path(paths.MESSAGES, MessagesConsumer.as_asgi()),
    re_path(paths.COUNT_TOKENS, CountTokensConsumer.as_asgi()),
    re_path(paths.MODELS, ModelListConsumer.as_asgi()),
    re_path(paths.MODEL, ModelConsumer.as_asgi()),
    re_path(paths.HEALTH, HealthConsumer.as_asgi()),
    re_path(paths.INFILL, InfillConsumer.as_asgi()),
    re_path(paths.TOKENIZE, TokenizerConsumer.as_asgi()),
    re_path(paths.DETOKENIZE, DetokenizeConsumer.as_asgi()),
    re_path(paths.METRICS, MetricsConsumer.as_asgi()),
    re_path(paths.OPENAPI, OpenApiConsumer.as_asgi()),
]
# Health probes and scrapes still answer when --conns is reached.
UNGATED_PATHS = ("health", "v1/health", "metrics")


def is_api_path(path: str) -> bool:
    relative = path.lstrip("/")
    return any(pattern.pattern.match(relative) for pattern in api_urlpatterns)


def consumer_for(path: str) -> type | None:
    """The API consumer class that serves ``path``, or None when the path is not an API one."""
    relative = path.lstrip("/")
    for pattern in api_urlpatterns:
        if pattern.pattern.match(relative):
            return pattern.callback.consumer_class
    return None


def django_serves(path: str) -> bool:
    """True if ``path`` is a static file's or the Django URL conf has a view for it (or for it
    with a slash added)."""
    if path.startswith("/" + settings.STATIC_URL.strip("/") + "/"):
        return True
    for candidate in (path, path if path.endswith("/") else path + "/"):
        try:
            resolve(candidate)
            return True
        except Resolver404:
            continue
    return False


async def send_json_error(scope, send, error: ApiError) -> None:
    """Answer with an error outside any consumer (the connection gate, a missing model)."""
    headers = [(b"content-type", b"application/json"), *error.headers()]
    anthropic = wants_anthropic_errors(scope["path"], scope["headers"])
    payload = error.anthropic_payload() if anthropic else error.openai_payload()
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps(payload).encode()})


class LmserveRouter:
    """API consumers first, then Django, then the JSON 404."""

    def __init__(self, django_app):
        self.django_app = django_app
        self.api_app = URLRouter([*api_urlpatterns, re_path(r"", NotFoundConsumer.as_asgi())])

    async def __call__(self, scope, receive, send):
        path = scope["path"]
        if scope["type"] == "http" and not is_api_path(path) and django_serves(path):
            return await self.django_app(scope, receive, send)
        return await self.api_app(scope, receive, send)


class ConnectionLimitMiddleware:
    """``--conns``: requests beyond the cap get a 503 at once instead of piling up."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            service = services.current()
        except ModelFileError as exc:
            return await send_json_error(scope, send, ApiError(503, str(exc), None, "model_not_found"))
        gate = service.connections
        if scope["path"].strip("/") in UNGATED_PATHS:
            return await self.app(scope, receive, send)
        if not gate.try_enter():
            refusal = ApiError(
                503,
                f"too many open connections (--conns {gate.limit}); retry later",
                None,
                "too_many_connections",
                retry_after=1,
            )
            return await send_json_error(scope, send, refusal)
        try:
            return await self.app(scope, receive, send)
        finally:
            gate.leave()


class AllowedHostsMiddleware:
    """A request whose Host header names none of ``ALLOWED_HOSTS`` gets a 400, on every path
    (Django checks only its own views): a page that rebinds its DNS name to this machine
    reaches the server under that name, and is refused here."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            host = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"host"), None)
            if host is not None and not validate_host(split_domain_port(host)[0], settings.ALLOWED_HOSTS):
                message = (
                    f"the Host header {host!r} is not one this server answers to "
                    f"({', '.join(settings.ALLOWED_HOSTS)}); add it with --allowed-hosts"
                )
                return await send_json_error(scope, send, ApiError(400, message, None, "disallowed_host"))
        return await self.app(scope, receive, send)


def build_application(django_app):
    """The ASGI application lmserve serves."""
    from channels.routing import ProtocolTypeRouter

    gated = ConnectionLimitMiddleware(LmserveRouter(django_app))
    return ProtocolTypeRouter({"http": RequestMetricsMiddleware(AllowedHostsMiddleware(gated))})
