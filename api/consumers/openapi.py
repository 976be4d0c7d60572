"""GET /openapi.json: the API's OpenAPI 3.1 document (api/openapi/), open like /health: it
describes the server and holds no secret."""

from __future__ import annotations

from functools import cache

from api.openapi.document import build_document

from .base import ApiConsumer


@cache
def document() -> dict:
    return build_document()


class OpenApiConsumer(ApiConsumer):
    """The document, built once per process."""

    needs_auth = False

    async def respond(self, body: bytes) -> None:
        await self.send_json(200, document())
