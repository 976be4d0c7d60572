"""GET /metrics: Prometheus' text format (see api/metrics.py for what is measured).

Open by default, like /health: the numbers are counts and timings, never prompts or replies,
and a scraper should not need the key that lets a client spend model time. ``--metrics key``
puts it behind ``--api-key``; ``--metrics off`` answers 404.
"""

from __future__ import annotations

from api.auth import check_api_key
from api.errors import ApiError, not_found
from api.metrics import exposition

from .base import ApiConsumer


class MetricsConsumer(ApiConsumer):
    """The metrics exposition, guarded as ``--metrics`` says."""

    needs_auth = False  # decided per request from --metrics, in check_request

    def check_request(self) -> ApiError | None:
        mode = self.service.config.metrics
        if mode == "off":
            return not_found("metrics are off on this server (--metrics off)")
        refusal = super().check_request()
        if refusal is None and mode == "key":
            refusal = check_api_key(self.service.config.api_key, self.scope["headers"])
        return refusal

    async def respond(self, body: bytes) -> None:
        data, content_type = exposition()
        self._headers_sent = self._answered = True
        headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(data)).encode())]
        await self.send_response(200, data, headers=headers)
