"""The inference worker: the one thread that owns the model.

It loads the engine (the server answers 503 until then), warms up the JIT, then serves jobs
from the queue. ``take`` hands it every job already waiting, up to ``--batch``: an idle server
serves a lone request at once. With ``--batch N`` generations run in lockstep
(``generation/lockstep.py``: one weight pass per step for all of them), and requests that
arrive while a batch runs join it between steps, up to N; each stream has a KV slot of its
own: ``--kv-slots`` is raised to at least ``--batch`` before the RAM guard prices the pool.
Under ``--spec`` a lone request decodes speculatively instead, and later ones wait for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from inference.engine.load_options import LoadOptions
from inference.engine.prefix import PrefixMismatchError
from inference.generation.backends import BackendSetup, GenerationBackend, backend_for
from inference.generation.embeddings import embed_all
from inference.generation.lockstep import Joins
from inference.generation.stream import BatchItem
from inference.kv.prefix_source import PrefixSource
from inference.runtime.queue import Job, JobQueue
from inference.types import EmbeddingRequest, Error

logger = logging.getLogger("lmserve.worker")

LOADING, READY, FAILED, STOPPED = "loading", "ready", "failed", "stopped"
SHUTTING_DOWN = Error(503, "the server is shutting down", code="shutting_down")


@dataclass
class BatchStats:
    """Lockstep batches served since start (read by GET /metrics)."""

    batches: int = 0  # lockstep runs of two or more generations
    streams: int = 0  # generations served in them
    largest: int = 0

    def record(self, streams: int) -> None:
        self.batches += 1
        self.streams += streams
        self.largest = max(self.largest, streams)


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
        spec: bool = False,
        prefix_source: PrefixSource | None = None,
        nanochat: bool = False,
        load_options: LoadOptions | None = None,
    ):
        self.model_path = model_path  # a GGUF file, or a nanochat checkpoint directory
        self.nanochat = nanochat
        self.load_options = load_options or LoadOptions()  # --experts, --expert-cache: how experts are held
        self.queue = queue
        self.requested_ctx = n_ctx
        self.kv_slots = max(kv_slots, batch)  # one resident cache per lockstep stream
        self.kv_slots_force = kv_slots_force
        self.kv_cache_dir = kv_cache_dir
        self.kv_disk_slots = kv_disk_slots
        self.batch = batch
        self.batches = BatchStats()
        self.spec = spec
        self.on_failure = on_failure
        # Where conversations' KV prefixes come from (a cartridge, a fleet); checked against
        # the model once it loads, so a foreign one fails the start-up with its own message.
        self.prefix_source = prefix_source
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
        t0 = time.perf_counter()
        try:
            backend = self._nanochat_backend() if self.nanochat else self._gguf_backend()
        except PrefixMismatchError as exc:  # the user's mistake, named: no traceback
            logger.error("%s", exc)
            return self._failed(f"refusing to serve {self.model_path.name}: {exc}")
        except Exception as exc:
            logger.exception("loading %s failed", self.model_path)
            return self._failed(f"loading {self.model_path.name} failed: {type(exc).__name__}: {exc}")
        self.backend = backend
        self.state = READY
        self.ready.set()
        logger.info(
            "model %s ready in %.1f s (ctx %d)", self.model_path.name, time.perf_counter() - t0, backend.n_ctx
        )
        return True

    def _gguf_backend(self) -> GenerationBackend:
        """Load the GGUF file, size the KV tiers, build its family's backend and warm it up."""
        from inference.engine.engine import Engine
        from inference.engine.jit.compile_watch import CompileWatch, warm_up_notice

        engine = Engine.load(self.model_path, self.load_options)
        n_ctx = min(self.requested_ctx, engine.config.n_ctx_train)
        if n_ctx < self.requested_ctx:
            logger.warning(
                "--ctx %d exceeds the model's training context; using %d", self.requested_ctx, n_ctx
            )
        if self.prefix_source is not None:  # a source made for another model is refused here
            self.prefix_source.check(engine)
        self.kv_slots = self._guard_kv_slots(engine, n_ctx)
        if self.kv_slots < self.batch:
            logger.warning(
                "--batch %d lowered to %d: a lockstep stream needs a KV slot of its own",
                self.batch,
                self.kv_slots,
            )
            self.batch = self.kv_slots
        disk = self._disk_tier(engine)
        setup = BackendSetup(
            engine, n_ctx, self.kv_slots, disk, self.prefix_source, spec=self.spec, batch=self.batch
        )
        backend = backend_for(setup)
        logger.info("%s", warm_up_notice())
        with CompileWatch(lambda line: logger.info("%s", line)):
            backend.warm_up()
        backend.release()
        return backend

    def _nanochat_backend(self) -> GenerationBackend:
        """Load the nanochat checkpoint directory (``--nanochat``): its own engine, one
        request at a time, every request on a fresh cache."""
        from inference.engine.nanochat_checkpoint import load_checkpoint

        checkpoint = load_checkpoint(self.model_path)
        self.batch = 1
        backend = backend_for(BackendSetup(None, self.requested_ctx, nanochat=checkpoint))
        backend.warm_up()
        return backend

    def _failed(self, message: str) -> bool:
        """The model cannot be served: fail waiting jobs and report ``message``."""
        self.error = message
        self.state = FAILED
        for job in self.queue.close():
            job.pipe.close(Error(503, self.error, code="model_load_failed"))
        if self.on_failure is not None:
            self.on_failure(self.error)
        return False

    def _guard_kv_slots(self, engine, n_ctx: int) -> int:
        """The slot count the RAM guard allows, its arithmetic logged."""
        from inference.kv.ram_guard import available_memory, judge_kv_slots

        slot_bytes = engine.new_cache(n_ctx).nbytes  # zeroed pages are not committed: free to probe
        source = self.prefix_source
        reserved = engine.serving_bytes + (source.serving_bytes() if hasattr(source, "serving_bytes") else 0)
        verdict = judge_kv_slots(self.kv_slots, slot_bytes, available_memory(), self.kv_slots_force, reserved)
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
        """Serve the jobs taken together: embeddings one by one, then the generations in one
        lockstep batch that later requests may join, when the backend shares a weight pass
        among streams (``--batch`` is refused at start-up for one that cannot); else one after
        another. Under ``--spec`` a lone generation runs alone, speculatively."""
        generations = [job for job in jobs if not isinstance(job.request, EmbeddingRequest)]
        for job in jobs:
            if isinstance(job.request, EmbeddingRequest):
                self._serve([job])
        lockstep = self.batch > 1 and self.backend.capabilities.batch
        if generations and lockstep and (len(generations) > 1 or not self.spec):
            self._serve(generations, lockstep=True)
        else:
            for job in generations:
                self._serve([job])

    def _serve(self, jobs: list[Job], lockstep: bool = False) -> None:
        """Run one job, or a lockstep batch of generations (``jobs`` grows as requests join
        it), registered as in flight."""
        with self._lock:
            self._in_flight.extend(jobs)
        # Registered first, checked second: a shutdown racing with take() either sees these
        # jobs in flight or has already closed the queue.
        if self.queue.closed:
            for job in jobs:
                job.pipe.abort(SHUTTING_DOWN)
        t0 = time.perf_counter()
        try:
            if lockstep:
                self._run_lockstep(jobs)
            else:
                self._count(self._run_jobs(jobs))
        except Exception as exc:  # the backend reports its own failures; this is a last resort
            logger.exception("job(s) %s failed", ", ".join(str(job.id) for job in jobs))
            error = Error(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")
            for job in jobs:
                job.pipe.close(error)
        finally:
            self.backend.release()
            with self._lock:
                for job in jobs:
                    self._in_flight.remove(job)
        self.seconds_per_job = 0.8 * self.seconds_per_job + 0.2 * (time.perf_counter() - t0)

    def _count(self, tokens: int) -> None:
        """Add a finished generation's tokens to the count /health reports."""
        with self._lock:
            self.tokens_generated += tokens

    def _run_lockstep(self, jobs: list[Job]) -> None:
        """Serve a lockstep batch that starts with ``jobs``; the generations that join it are
        appended to ``jobs`` (in flight, like the first ones), and the ones that have ended
        leave both lists when others join: under steady load a batch runs for as long as the
        load lasts, and its ended jobs must not pile up meanwhile (nor wait for its end to be
        counted)."""
        served = len(jobs)

        def take(room: int) -> list[BatchItem]:
            nonlocal served
            joined = self.queue.take_waiting(room, lambda job: not isinstance(job.request, EmbeddingRequest))
            with self._lock:
                for job in [job for job in jobs if job.pipe.closed]:
                    jobs.remove(job)
                    self._in_flight.remove(job)
                self._in_flight.extend(joined)
            jobs.extend(joined)
            served += len(joined)
            if self.queue.closed:  # as in _serve: registered first, checked second
                for job in joined:
                    job.pipe.abort(SHUTTING_DOWN)
            return [_batch_item(job) for job in joined]

        items = [_batch_item(job) for job in jobs]
        self.backend.generate_batch(items, Joins(take, self.batch, ended=self._count))
        if served > 1:
            self.batches.record(served)

    def _run_jobs(self, jobs: list[Job]) -> int:
        """The tokens generated by serving one job."""
        (job,) = jobs
        if job.cancelled:
            return 0
        if isinstance(job.request, EmbeddingRequest):
            embed_all(self.backend.engine, job.prompt, job.pipe)
            return 0
        return self.backend.generate(job.request, job.prompt, job.pipe)


def _batch_item(job: Job) -> BatchItem:
    """A queued generation as a stream of a lockstep batch."""
    return BatchItem(job.request, job.prompt, job.pipe)
