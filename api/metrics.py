"""Prometheus metrics, served as text by ``GET /metrics`` (prometheus-client).

Three sources feed one registry:

- :class:`RequestMetricsMiddleware` counts every answered HTTP request by endpoint and status
  as its response starts (so a 429 or a 503 from the connection gate is counted too);
- :class:`MeteredPipe`, the stream pipe of every generation, times the first reply token and
  the decode rate and adds up the tokens of each finished reply;
- :class:`ServiceCollector` reads the live state at scrape time: queue depth, in-flight jobs,
  open connections, readiness, and the KV slot pool's hit counters.

Endpoint labels are the route templates (``/v1/chat/completions``, ``/v1/models/{model}``),
never raw paths: a scanner requesting random paths cannot grow the label set.
"""

from __future__ import annotations

import re
import time

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from api.paths import API_PATHS
from inference.runtime.pipe import StreamPipe
from inference.types import Finish, ReasoningDelta, TextDelta, ToolCallDelta

REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

REQUESTS = Counter(
    "lmserve_http_requests",
    "HTTP requests answered, by endpoint (route template) and status code",
    ["endpoint", "status"],
    registry=REGISTRY,
)
QUEUE_FULL = Counter(
    "lmserve_queue_full",
    "requests refused with 429 because the --queue was full",
    registry=REGISTRY,
)
PROMPT_TOKENS = Counter(
    "lmserve_prompt_tokens", "prompt tokens of finished replies", ["endpoint"], registry=REGISTRY
)
CACHED_TOKENS = Counter(
    "lmserve_cached_prompt_tokens",
    "prompt tokens of finished replies that were reused from a KV slot instead of prefilled",
    ["endpoint"],
    registry=REGISTRY,
)
GENERATED_TOKENS = Counter(
    "lmserve_generated_tokens", "tokens generated for finished replies", ["endpoint"], registry=REGISTRY
)
TIME_TO_FIRST_TOKEN = Histogram(
    "lmserve_time_to_first_token_seconds",
    "seconds from queueing a generation to its first reply event (queue wait + prefill + first step)",
    ["endpoint"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120),
    registry=REGISTRY,
)
DECODE_RATE = Histogram(
    "lmserve_decode_tokens_per_second",
    "tokens per second of a finished reply after its first event (the decode rate a client sees)",
    ["endpoint"],
    buckets=(1, 2, 5, 10, 20, 35, 50, 75, 100, 150, 200, 300, 500),
    registry=REGISTRY,
)


def _route_template(pattern: str) -> str:
    """``^(?:v1/)?models/(?P<model_id>.+?)/?$`` -> ``/v1/models/{model}``."""
    text = pattern.removeprefix("^").removesuffix("$").removesuffix("/?")
    text = text.replace("(?:v1/)?", "v1/").replace("\\", "")
    text = re.sub(r"\(\?P<(\w+?)(?:_id)?>[^)]*\)", r"{\1}", text)
    return "/" + text


API_ROUTES = [(re.compile(pattern), _route_template(pattern)) for pattern in API_PATHS]


def endpoint_label(path: str) -> str:
    """The metric label of a request path: its API route template, else a coarse class."""
    relative = path.lstrip("/")
    for regex, template in API_ROUTES:
        if regex.match(relative):
            return template
    if relative == "":
        return "/"
    if relative.startswith(("static/", "admin/")):
        return "/" + relative.split("/", 1)[0] + "/"
    return "other"


def count_response(path: str, status: int) -> None:
    """Count one answered request (the middleware, and refusals made before the application)."""
    REQUESTS.labels(endpoint_label(path), str(status)).inc()
    if status == 429:
        QUEUE_FULL.inc()


def count_unparsed(status: int) -> None:
    """Count one request refused before its request line could be read (no path to label)."""
    REQUESTS.labels("other", str(status)).inc()


class RequestMetricsMiddleware:
    """Counts each HTTP response by endpoint and status as it starts."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                count_response(scope["path"], message["status"])
            await send(message)

        return await self.app(scope, receive, counting_send)


class MeteredPipe(StreamPipe):
    """A StreamPipe that times its reply and counts its tokens as the worker pushes events."""

    def __init__(self, loop, endpoint: str):
        super().__init__(loop)
        self.endpoint = endpoint
        self.queued_at = time.perf_counter()
        self.first_event_at: float | None = None

    def push(self, event) -> None:
        if not self.closed:
            now = time.perf_counter()
            if self.first_event_at is None and isinstance(event, (TextDelta, ReasoningDelta, ToolCallDelta)):
                self.first_event_at = now
                TIME_TO_FIRST_TOKEN.labels(self.endpoint).observe(now - self.queued_at)
            elif isinstance(event, Finish):
                self._count_finished(event, now)
        super().push(event)

    def _count_finished(self, finish: Finish, now: float) -> None:
        usage = finish.usage
        PROMPT_TOKENS.labels(self.endpoint).inc(usage.prompt_tokens)
        CACHED_TOKENS.labels(self.endpoint).inc(usage.cached_tokens)
        GENERATED_TOKENS.labels(self.endpoint).inc(usage.completion_tokens)
        if self.first_event_at is not None and usage.completion_tokens > 1 and now > self.first_event_at:
            # The first event carries the first token: the rate is over the tokens after it.
            rate = (usage.completion_tokens - 1) / (now - self.first_event_at)
            DECODE_RATE.labels(self.endpoint).observe(rate)


class ServiceCollector:
    """The server's live state, read at scrape time from the installed InferenceService."""

    def collect(self):
        from inference.runtime import service as services

        service = services.current()
        health = service.health()
        gauges = {
            "lmserve_queue_depth": ("requests waiting for the worker", health["queued"]),
            "lmserve_queue_capacity": ("requests that may wait (--queue)", service.config.queue),
            "lmserve_in_flight": ("requests being generated now", health["in_flight"]),
            "lmserve_open_connections": ("requests being served (see --conns)", health["connections"]),
            "lmserve_ready": ("1 when the model is loaded and serving, else 0", int(service.ready)),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
        yield from self._kv_metrics(service)
        yield from self._batch_metrics(service.worker)
        yield from llamacpp_metrics(service, health)

    def _batch_metrics(self, worker):
        stats = worker.batches
        yield GaugeMetricFamily(
            "lmserve_batch_width",
            "generations decoded together at most (--batch, after the RAM guard)",
            value=worker.batch,
        )
        yield CounterMetricFamily(
            "lmserve_lockstep_batches", "lockstep runs of two or more generations", value=stats.batches
        )
        yield CounterMetricFamily(
            "lmserve_lockstep_streams", "generations served inside lockstep runs", value=stats.streams
        )

    def _kv_metrics(self, service):
        slots = getattr(service.worker.backend, "slots", None)  # None until loaded, or without KV reuse
        stats = slots.stats if slots is not None else None
        hits = CounterMetricFamily(
            "lmserve_kv_hits",
            "generations that started from cached KV rows, by tier (a resident slot, or a "
            "sidecar file of the disk tier restored into a slot)",
            labels=["tier"],
        )
        hits.add_metric(["resident"], stats.resident_hits if stats else 0)
        hits.add_metric(["disk"], stats.disk_hits if stats else 0)
        yield hits
        misses = stats.misses if stats else 0
        yield CounterMetricFamily("lmserve_kv_misses", "generations with no reusable KV prefix", value=misses)
        yield CounterMetricFamily(
            "lmserve_kv_disk_spills",
            "KV slots written to the disk tier before being reused",
            value=stats.disk_spills if stats else 0,
        )
        yield GaugeMetricFamily(
            "lmserve_kv_slots",
            "resident KV slots (--kv-slots after the RAM guard)",
            value=len(slots.slots) if slots is not None else 0,
        )


def llamacpp_metrics(service, health: dict):
    """The series llama-server's ``/metrics`` exports, under its names (``llamacpp:``), for
    dashboards and autoscalers written for it. Token counters count prefilled prompt tokens
    (not those reused from a KV slot) and generated tokens of every generation once it ends;
    the throughput gauges are averages over the server's life (llama.cpp's over the time since
    the previous scrape); the drafted-token counters are exported with ``--spec``."""
    backend = service.worker.backend
    totals = getattr(backend, "totals", None)  # a backend with its own loop may keep none
    counters = {
        "llamacpp:prompt_tokens": ("Number of prompt tokens processed.", "prompt_tokens"),
        "llamacpp:prompt_seconds": ("Prompt process time.", "prompt_seconds"),
        "llamacpp:tokens_predicted": ("Number of generation tokens processed.", "predicted_tokens"),
        "llamacpp:tokens_predicted_seconds": ("Predict process time.", "predicted_seconds"),
    }
    if service.config.spec:
        counters["llamacpp:tokens_drafted"] = ("Number of speculative tokens drafted.", "drafted_tokens")
        counters["llamacpp:tokens_drafted_accepted"] = (
            "Number of speculative drafted tokens accepted.",
            "accepted_tokens",
        )
    for name, (doc, field) in counters.items():
        yield CounterMetricFamily(name, doc, value=getattr(totals, field, 0) if totals else 0)
    prompt_rate = predicted_rate = 0.0
    if totals is not None and totals.prompt_seconds > 0:
        prompt_rate = totals.prompt_tokens / totals.prompt_seconds
    if totals is not None and totals.predicted_seconds > 0:
        predicted_rate = totals.predicted_tokens / totals.predicted_seconds
    slots = getattr(backend, "slots", None)
    used = capacity = 0
    if slots is not None:
        used = sum(slot["tokens"] + slot["prefix_rows"] for slot in slots.status())
        capacity = len(slots.slots) * backend.n_ctx
    gauges = {
        "llamacpp:prompt_tokens_seconds": ("Average prompt throughput in tokens/s.", prompt_rate),
        "llamacpp:predicted_tokens_seconds": ("Average generation throughput in tokens/s.", predicted_rate),
        "llamacpp:kv_cache_usage_ratio": (
            "KV-cache usage. 1 means 100 percent usage.",
            used / capacity if capacity else 0.0,
        ),
        "llamacpp:kv_cache_tokens": ("KV-cache tokens.", used),
        "llamacpp:requests_processing": ("Number of requests processing.", health["in_flight"]),
        "llamacpp:requests_deferred": ("Number of requests deferred.", health["queued"]),
    }
    for name, (doc, value) in gauges.items():
        yield GaugeMetricFamily(name, doc, value=value)


REGISTRY.register(ServiceCollector())


def exposition() -> tuple[bytes, str]:
    """The current metrics in Prometheus' text format, and its content type."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
