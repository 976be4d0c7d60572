"""The inference worker: the one thread that owns the model.

It loads the engine (the server answers 503 until then), warms up the JIT, then serves jobs
from the queue. ``take`` hands it every job already waiting up to ``batch``; today they are
served one after another, and a lockstep batch (one weight pass for several streams) or a
speculative verifier slots in at ``_serve_batch`` without touching connections or queue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from inference.generation.backends import BackendSetup, GenerationBackend, backend_for
from inference.generation.embeddings import embed_all
from inference.runtime.queue import Job, JobQueue
from inference.types import EmbeddingRequest, Error

logger = logging.getLogger("lmserve.worker")

LOADING, READY, FAILED, STOPPED = "loading", "ready", "failed", "stopped"
SHUTTING_DOWN = Error(503, "the server is shutting down", code="shutting_down")


class InferenceWorker:
    """Loads ``model_path`` on its own thread and serves ``queue`` until it is closed."""

    def __init__(
        self,
        model_path: Path,
        queue: JobQueue,
        n_ctx: int,
        kv_slots: int = 1,
        batch: int = 1,
        kv_slots_force: bool = False,
        kv_cache_dir: Path | None = None,
        kv_disk_slots: int = 8,
        on_failure: Callable[[str], None] | None = None,
    ):
        self.model_path = model_path
        self.queue = queue
        self.requested_ctx = n_ctx
        self.kv_slots = kv_slots
        self.kv_slots_force = kv_slots_force
        self.kv_cache_dir = kv_cache_dir
        self.kv_disk_slots = kv_disk_slots
        self.batch = batch
        self.on_failure = on_failure
        self.state = LOADING
        self.error: str | None = None
        self.backend: GenerationBackend | None = None
        self.ready = threading.Event()
        self.tokens_generated = 0
        self.seconds_per_job = 1.0  # running average, for Retry-After estimates
        self._in_flight: list[Job] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="lmserve-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end; True if it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def abort_in_flight(self, error: Error) -> None:
        """Fail the jobs being generated now; the thread stops them at their next token."""
        with self._lock:
            for job in self._in_flight:
                job.pipe.abort(error)

    # -- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        if not self._load():
            return
        while True:
            jobs = self.queue.take(self.batch)
            if not jobs:
                break  # closed and drained
            self._serve_batch(jobs)
        self.state = STOPPED
        logger.info("worker stopped")

    def _load(self) -> bool:
        from inference.engine.engine import Engine
        from inference.engine.numba_cache import warm_up_notice

        t0 = time.perf_counter()
        try:
            engine = Engine.load(self.model_path)
            n_ctx = min(self.requested_ctx, engine.config.n_ctx_train)
            if n_ctx < self.requested_ctx:
                logger.warning(
                    "--ctx %d exceeds the model's training context; using %d", self.requested_ctx, n_ctx
                )
            self.kv_slots = self._guard_kv_slots(engine, n_ctx)
            backend = backend_for(BackendSetup(engine, n_ctx, self.kv_slots, self._disk_tier(engine)))
            logger.info("%s", warm_up_notice())
            backend.warm_up()
            backend.release()
        except Exception as exc:
            logger.exception("loading %s failed", self.model_path)
            self.error = f"loading {self.model_path.name} failed: {type(exc).__name__}: {exc}"
            self.state = FAILED
            for job in self.queue.close():
                job.pipe.close(Error(503, self.error, code="model_load_failed"))
            if self.on_failure is not None:
                self.on_failure(self.error)
            return False
        self.backend = backend
        self.state = READY
        self.ready.set()
        logger.info("model %s ready in %.1f s (ctx %d)", engine.model_id, time.perf_counter() - t0, n_ctx)
        return True

    def _guard_kv_slots(self, engine, n_ctx: int) -> int:
        """The slot count the RAM guard allows, its arithmetic logged."""
        from inference.kv.ram_guard import available_memory, judge_kv_slots

        slot_bytes = engine.new_cache(n_ctx).nbytes  # zeroed pages are not committed: free to probe
        verdict = judge_kv_slots(self.kv_slots, slot_bytes, available_memory(), self.kv_slots_force)
        getattr(logger, verdict.level)("%s", verdict.message)
        return verdict.slots

    def _disk_tier(self, engine):
        """The sidecar store under --kv-cache-dir (files of an earlier run found again), if any."""
        if self.kv_cache_dir is None:
            return None
        from inference.kv.disk import SidecarStore

        return SidecarStore(
            self.kv_cache_dir, self.kv_disk_slots, engine.config.kv_geometry, engine.fingerprint
        )

    def _serve_batch(self, jobs: list[Job]) -> None:
        """Serve jobs taken together. Sequential for now: each runs to completion in order."""
        for job in jobs:
            self._serve_one(job)

    def _serve_one(self, job: Job) -> None:
        with self._lock:
            self._in_flight.append(job)
        # Registered first, checked second: a shutdown racing with take() either sees this
        # job in flight or has already closed the queue.
        if self.queue.closed:
            job.pipe.abort(SHUTTING_DOWN)
        t0 = time.perf_counter()
        generated = 0
        try:
            if job.cancelled:
                pass
            elif isinstance(job.request, EmbeddingRequest):
                embed_all(self.backend.engine, job.prompt, job.pipe)
            else:
                generated = self.backend.generate(job.request, job.prompt, job.pipe)
        except Exception as exc:  # the backend reports its own failures; this is a last resort
            logger.exception("job %d failed", job.id)
            job.pipe.close(Error(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error"))
        finally:
            self.backend.release()
            with self._lock:
                self.tokens_generated += generated
                self._in_flight.remove(job)
        self.seconds_per_job = 0.8 * self.seconds_per_job + 0.2 * (time.perf_counter() - t0)
