"""GET /v1/models, GET /v1/models/{id}, GET /health, and the JSON 404 for unknown paths."""

from __future__ import annotations

from api.errors import ApiError, not_found

from .base import ApiConsumer


def model_object(service) -> dict:
    """The one model this process serves, as OpenAI's model object."""
    try:
        created = int(service.model_path.stat().st_mtime)
    except OSError:
        created = 0
    return {"id": service.model_id, "object": "model", "created": created, "owned_by": "lmserve"}


class ModelListConsumer(ApiConsumer):
    """GET /v1/models: a list with exactly the loaded model."""

    async def respond(self, body: bytes) -> None:
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
        await self.send_json(200, model_object(self.service))


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
