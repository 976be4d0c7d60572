"""Process-wide server state: the configuration, the queue, the worker, open connections.

Exactly one :class:`InferenceService` serves per process. The ``lmserve`` command builds it
from its flags and installs it before serving; under ``runserver`` (or any ASGI server given
``lmserve_site.asgi``) the first request starts one on ``settings.LMSERVE_MODEL``. Importing
this module, Django's settings or the URL conf never loads a model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from inference.engine.load_options import ExpertMode, LoadOptions
from inference.generation.capabilities import CAPABILITY_NAMES, Capabilities
from inference.kv.prefix_source import PrefixSource
from inference.model_files import resolve_model
from inference.runtime.pipe import StreamPipe
from inference.runtime.queue import Job, JobQueue, QueueClosed, QueueFull
from inference.runtime.worker import FAILED, READY, SHUTTING_DOWN, InferenceWorker
from inference.types import (
    EmbeddingRequest,
    Error,
    GenerationRequest,
    PreparedEmbedding,
    PreparedPrompt,
    SamplingOverrides,
)

logger = logging.getLogger("lmserve.service")

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class ServeConfig:
    """The serving flags (``manage.py lmserve --help`` documents each)."""

    model: str = ""  # a path, a name in LMSERVE_MODELS_DIR, or "" for the default model
    ctx: int = 4096
    api_key: str | None = None
    queue: int = 16
    conns: int = 64
    kv_slots: int = 1
    batch: int = 1  # generations decoded together in lockstep (--kv-slots is raised to match)
    kv_slots_force: bool = False
    kv_cache_dir: str | None = None  # spill evicted slots to sidecar files here
    kv_disk_slots: int = 8
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    stream_start_after: float = 3.0  # seconds a streamed request waits before its stream opens
    keepalive_every: float = 10.0  # seconds between keep-alives on an open stream with no events
    metrics: str = "open"  # GET /metrics: "open" (no key), "key" (needs --api-key) or "off"
    spec: bool = False  # speculative decoding
    # --temp, --seed, ...: what a request that leaves a sampling field out gets
    sampling: SamplingOverrides = dataclasses.field(default_factory=SamplingOverrides)
    nanochat: str | None = None  # a nanochat checkpoint directory (--nanochat) instead of a GGUF
    experts: str = "repack"  # MoE experts: "repack" at load, or "borrow" from the mapped file
    expert_cache: int = 16  # converted experts kept per expert tensor when borrowing


class ConnectionGate:
    """Counts requests being served so ``--conns`` can refuse the one too many (health probes
    are not counted). Used from the event loop only."""

    def __init__(self, limit: int):
        self.limit = limit
        self.open = 0

    def try_enter(self) -> bool:
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def leave(self) -> None:
        self.open -= 1


class InferenceService:
    """Everything a connection needs to get a request generated."""

    def __init__(
        self,
        config: ServeConfig,
        model_path: Path,
        on_failure: Callable[[str], None] | None = None,
        prefix_source: PrefixSource | None = None,
    ):
        self.config = config
        self.model_path = model_path
        self.prefix_source = prefix_source
        self.queue = JobQueue(config.queue)
        self.worker = InferenceWorker(
            model_path,
            self.queue,
            config.ctx,
            config.kv_slots,
            batch=config.batch,
            kv_slots_force=config.kv_slots_force,
            kv_cache_dir=Path(config.kv_cache_dir) if config.kv_cache_dir else None,
            kv_disk_slots=config.kv_disk_slots,
            on_failure=on_failure,
            spec=config.spec,
            prefix_source=prefix_source,
            nanochat=config.nanochat is not None,
            load_options=LoadOptions(ExpertMode(config.experts), config.expert_cache),
        )
        self.connections = ConnectionGate(config.conns)
        self.stopping = False

    @classmethod
    def from_config(cls, config: ServeConfig, **kwargs) -> InferenceService:
        """Resolve the model file now (raises ModelFileError) but load it only on start()."""
        if config.nanochat is not None:
            return cls(config, Path(config.nanochat), **kwargs)
        return cls(config, resolve_model(config.model), **kwargs)

    @property
    def model_id(self) -> str:
        return self.model_path.name.removesuffix(".gguf")

    @property
    def state(self) -> str:
        return "stopping" if self.stopping else self.worker.state

    @property
    def ready(self) -> bool:
        return self.worker.state == READY and not self.stopping

    def start(self) -> None:
        self.worker.start()

    def unavailable(self) -> Error | None:
        """Why requests cannot be served right now, or None when they can."""
        if self.stopping:
            return SHUTTING_DOWN
        if self.worker.state == FAILED:
            return Error(503, self.worker.error or "the model failed to load", code="model_load_failed")
        if self.worker.state != READY:
            return Error(503, f"model {self.model_id} is still loading", code="model_loading", retry_after=1)
        return None

    @property
    def loaded_capabilities(self) -> Capabilities | None:
        """What the loaded backend does (None until the model is loaded)."""
        backend = self.worker.backend
        return None if backend is None else backend.capabilities

    @property
    def supports_reasoning(self) -> bool:
        """Whether the loaded model has a reasoning channel (False until it is loaded)."""
        can = self.loaded_capabilities
        return can is not None and can.reasoning

    @property
    def supports_tools(self) -> bool:
        """Whether the loaded model has a function-calling convention (False until loaded)."""
        can = self.loaded_capabilities
        return can is not None and can.tools

    @property
    def kv_reuse(self) -> bool | None:
        """Whether requests may reuse KV rows of earlier ones (None until the model is loaded)."""
        can = self.loaded_capabilities
        return None if can is None else can.kv_reuse

    @property
    def experts(self) -> str | None:
        """How the loaded MoE model's routed experts are held ("repack" or "borrow", the
        --experts flag); None for a model without them or until it is loaded."""
        backend = self.worker.backend
        engine = None if backend is None else backend.engine
        return None if engine is None else engine.expert_mode

    async def prepare(self, request: GenerationRequest) -> PreparedPrompt | Error:
        """Render and tokenize off the event loop; a 400 here costs no model time."""
        return self.unavailable() or await asyncio.to_thread(self.worker.backend.validate, request)

    async def prepare_embedding(self, request: EmbeddingRequest) -> PreparedEmbedding | Error:
        """Tokenize the texts by the embedding contract, off the event loop; a text longer
        than the context is a 400 that costs no model time."""
        from inference.generation.embeddings import prepare_embedding

        down = self.unavailable() or self.embeddings_unavailable()
        if down is not None:
            return down
        backend = self.worker.backend
        return await asyncio.to_thread(prepare_embedding, backend.engine, backend.n_ctx, request)

    def embeddings_unavailable(self) -> Error | None:
        """A 400 when the loaded model serves no embeddings (a nanochat checkpoint has no
        GGUF engine to embed with); None when it does."""
        can = self.loaded_capabilities
        if can is not None and not can.embeddings:
            return Error(
                400, f"model {self.model_id} serves no embeddings", code="invalid_value", param="model"
            )
        return None

    async def count_tokens(self, request: GenerationRequest) -> int | Error:
        """How many tokens the request's prompt takes (the context limit is not checked)."""
        down = self.unavailable()
        if down is not None:
            return down
        tokens = await asyncio.to_thread(self.worker.backend.tokenize, request)
        return tokens if isinstance(tokens, Error) else len(tokens)

    def submit(
        self,
        request: GenerationRequest | EmbeddingRequest,
        prompt: PreparedPrompt | PreparedEmbedding,
        pipe: StreamPipe,
    ) -> Job | Error:
        """Queue a validated request; a full queue is a 429 with a Retry-After estimate."""
        down = self.unavailable()
        if down is not None:
            return down
        if isinstance(request, GenerationRequest) and not self.config.sampling.is_empty:
            request = dataclasses.replace(request, sampling=request.sampling.over(self.config.sampling))
        job = Job(request, prompt, pipe)
        try:
            self.queue.submit(job)
        except QueueFull:
            return Error(
                429,
                f"the request queue is full ({self.queue.capacity} waiting); retry later",
                code="queue_full",
                retry_after=self.retry_after(),
            )
        except QueueClosed:
            return SHUTTING_DOWN
        return job

    def cancel(self, job: Job) -> None:
        """The client left: drop the job if it still waits, else stop it at its next token."""
        job.pipe.cancel()
        self.queue.cancel(job)

    def retry_after(self) -> int:
        """Seconds until a queue slot is likely free: when the job in flight ends, the oldest
        waiting job leaves the queue."""
        return max(1, math.ceil(self.worker.seconds_per_job))

    @property
    def idle(self) -> bool:
        return len(self.queue) == 0 and self.worker.in_flight == 0

    def health(self) -> dict:
        """What GET /health reports (and what the prefix source says of itself, if any)."""
        health = {
            "status": "ok" if self.ready else self.state,
            "model": self.model_id,
            "queued": len(self.queue),
            "in_flight": self.worker.in_flight,
            "connections": self.connections.open,
            "tokens_generated": self.worker.tokens_generated,
            "kv_reuse": self.kv_reuse,
            "experts": self.experts,
            "capabilities": self.capabilities(),
            "sampling_defaults": {
                name: value
                for name, value in dataclasses.asdict(self.config.sampling).items()
                if value is not None
            },
        }
        describe = getattr(self.prefix_source, "describe", None)
        if describe is not None:
            health.update(describe())
        return health

    @property
    def chooses_prefix(self) -> bool:
        """Whether the worker picks a KV prefix per request (and may name fleet documents)."""
        return self.prefix_source is not None

    def features(self) -> dict | None:
        """The loaded backend's capabilities (``generation.capabilities.Capabilities``) by
        name; None until loaded."""
        can = self.loaded_capabilities
        return None if can is None else dataclasses.asdict(can)

    def capabilities(self) -> dict:
        """What the loaded model can do, for clients choosing features (the chat page): the
        backend's capabilities (all false until the model is loaded), the context and warm slots."""
        backend = self.worker.backend
        slots = None if backend is None else backend.slots  # None for a backend keeping no KV rows
        features = self.features() or dict.fromkeys(CAPABILITY_NAMES, False)
        return {
            **features,
            "ctx": None if backend is None else backend.n_ctx,
            "kv_slots": len(slots.slots) if slots is not None else 0,
        }

    # -- the admin's view of the KV tiers ---------------------------------------------------
    def kv_slots_status(self) -> list[dict]:
        """The live resident slots (empty until the model is loaded)."""
        slots = self._slots
        return slots.status() if slots is not None else []

    def kv_sidecars(self) -> list[dict]:
        """The sidecar files under --kv-cache-dir, read from the directory."""
        from inference.kv.disk import scan_sidecars

        directory = self.kv_cache_dir
        return scan_sidecars(directory) if directory is not None and directory.is_dir() else []

    @property
    def _slots(self):
        """The loaded backend's slot pool, if it keeps one."""
        backend = self.worker.backend
        return None if backend is None else backend.slots

    @property
    def kv_cache_dir(self) -> Path | None:
        return Path(self.config.kv_cache_dir) if self.config.kv_cache_dir else None

    def evict_kv_slot(self, index: int) -> str:
        """Free a resident slot now, or after the generation using it ("evicted" / "pending")."""
        slots = self._slots
        if slots is None or not 0 <= index < len(slots.slots):
            raise IndexError(f"no KV slot {index}")
        return slots.evict(index)

    def delete_kv_sidecar(self, name: str) -> bool:
        """Delete one sidecar file by name; False when there is no such file."""
        directory = self.kv_cache_dir
        if directory is None or Path(name).name != name or not name.endswith(".kv"):
            return False
        slots = self._slots
        if slots is not None and slots.delete_sidecar(name):
            return True
        path = directory / name  # not one the worker tracks (foreign or corrupt): just remove it
        if not path.is_file():
            return False
        path.unlink()
        return True

    def shutdown(self) -> None:
        """Refuse new work and fail every queued and in-flight job with a 503."""
        if self.stopping:
            return
        self.stopping = True
        for job in self.queue.close():
            job.pipe.abort(SHUTTING_DOWN)
        self.worker.abort_in_flight(SHUTTING_DOWN)
        logger.info("shutting down: queue closed, in-flight work cancelled")


_current: InferenceService | None = None
_current_lock = threading.Lock()


def install(service: InferenceService) -> None:
    """Make ``service`` the process's server (the lmserve command does this before serving)."""
    global _current
    with _current_lock:
        _current = service


def current() -> InferenceService:
    """The process's server; started on ``settings.LMSERVE_MODEL`` on first use if none was
    installed (``manage.py runserver``)."""
    global _current
    with _current_lock:
        if _current is None:
            from django.conf import settings

            config = ServeConfig(
                model=settings.LMSERVE_MODEL,
                max_body_bytes=getattr(settings, "LMSERVE_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES),
            )
            service = InferenceService.from_config(config)
            service.start()
            _current = service
        return _current
