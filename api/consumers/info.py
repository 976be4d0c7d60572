"""GET /v1/models, GET /v1/models/{id}, GET /health, and the JSON 404 for unknown paths."""

from __future__ import annotations

from datetime import UTC, datetime

from api.errors import ApiError, is_anthropic_client, not_found

from .base import ApiConsumer


def model_object(service) -> dict:
    """The one model this process serves, as OpenAI's model object, plus (once it is loaded)
    ``max_model_len`` (vLLM's name for the context served, ``--ctx``) and ``capabilities``:
    what its backend does (``generation.capabilities.Capabilities``)."""
    model = {"id": service.model_id, "object": "model", "created": _created(service), "owned_by": "lmserve"}
    features = service.features()
    if features is None:
        return model
    return {**model, "max_model_len": service.worker.backend.n_ctx, "capabilities": features}


def anthropic_model_object(service) -> dict:
    """The same model as Anthropic's model object (``created_at`` is RFC 3339)."""
    created = datetime.fromtimestamp(_created(service), tz=UTC).isoformat().replace("+00:00", "Z")
    return {"type": "model", "id": service.model_id, "display_name": service.model_id, "created_at": created}


def _created(service) -> int:
    try:
        return int(service.model_path.stat().st_mtime)
    except OSError:
        return 0


class ModelListConsumer(ApiConsumer):
    """GET /v1/models: a list with exactly the loaded model, in Anthropic's paged shape when an
    Anthropic client asks (it sends ``anthropic-version``), else in OpenAI's."""

    async def respond(self, body: bytes) -> None:
        if is_anthropic_client(self.scope["headers"]):
            model = anthropic_model_object(self.service)
            page = {"data": [model], "has_more": False, "first_id": model["id"], "last_id": model["id"]}
            await self.send_json(200, page)
            return
        await self.send_json(200, {"object": "list", "data": [model_object(self.service)]})


class ModelConsumer(ApiConsumer):
    """GET /v1/models/{id}: the loaded model, or 404 for any other id."""

    async def respond(self, body: bytes) -> None:
        wanted = self.scope["url_route"]["kwargs"]["model_id"]
        if wanted != self.service.model_id:
            await self.send_error(
                not_found(
                    f"model {wanted!r} not found; this server serves {self.service.model_id!r}",
                    "model_not_found",
                )
            )
            return
        anthropic = is_anthropic_client(self.scope["headers"])
        await self.send_json(200, (anthropic_model_object if anthropic else model_object)(self.service))


class HealthConsumer(ApiConsumer):
    """GET /health: 200 when ready to generate, 503 while loading (or stopping); never needs a key."""

    needs_auth = False

    async def respond(self, body: bytes) -> None:
        service = self.service
        payload = service.health()
        down = service.unavailable()
        if down is None:
            await self.send_json(200, payload)
            return
        error = ApiError.from_event(down)
        await self.send_json(503, {**payload, **error.openai_payload()}, error.headers())


class NotFoundConsumer(ApiConsumer):
    """Any path no endpoint or Django page claims: a JSON 404."""

    needs_auth = False
    methods = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

    async def respond(self, body: bytes) -> None:
        await self.send_error(not_found(f"no endpoint at {self.scope['method']} {self.scope['path']}"))
