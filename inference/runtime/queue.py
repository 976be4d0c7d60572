"""The bounded queue between connections and the one inference worker.

A full queue is an honest, immediate failure (HTTP 429 with Retry-After) instead of unbounded
waiting. The worker takes every job already queued up to a limit, so a later lockstep batch
can decode several requests together without delaying a lone one.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from inference.runtime.pipe import StreamPipe
from inference.types import EmbeddingRequest, GenerationRequest, PreparedEmbedding, PreparedPrompt

_job_ids = itertools.count(1)


@dataclass(eq=False)
class Job:
    """One validated request waiting for (or being served by) the worker."""

    request: GenerationRequest | EmbeddingRequest
    prompt: PreparedPrompt | PreparedEmbedding  # tokens (and max_tokens, clamped to the context)
    pipe: StreamPipe
    id: int = field(default_factory=lambda: next(_job_ids))
    enqueued_at: float = field(default_factory=time.monotonic)

    @property
    def cancelled(self) -> bool:
        return self.pipe.cancelled


class QueueFull(Exception):
    """Raised by :meth:`JobQueue.submit` when ``capacity`` jobs are already waiting."""


class QueueClosed(Exception):
    """Raised by :meth:`JobQueue.submit` once the server is shutting down."""


class JobQueue:
    """FIFO of waiting jobs, at most ``capacity`` long. Thread-safe."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"queue capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._jobs: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closed = False

    def __len__(self) -> int:
        with self._cond:
            return len(self._jobs)

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, job: Job) -> None:
        """Queue ``job`` or raise QueueFull / QueueClosed; never blocks."""
        with self._cond:
            if self._closed:
                raise QueueClosed()
            if len(self._jobs) >= self.capacity:
                raise QueueFull()
            self._jobs.append(job)
            self._cond.notify()

    def take(self, max_jobs: int = 1, timeout: float | None = None) -> list[Job]:
        """Wait for at least one job, then return up to ``max_jobs`` of those already queued
        (oldest first). Returns ``[]`` once the queue is closed and empty, or on timeout."""
        with self._cond:
            self._cond.wait_for(lambda: self._jobs or self._closed, timeout)
            taken = []
            while self._jobs and len(taken) < max_jobs:
                taken.append(self._jobs.popleft())
            return taken

    def take_waiting(self, max_jobs: int, accept: Callable[[Job], bool]) -> list[Job]:
        """Without waiting: up to ``max_jobs`` of the jobs at the head of the queue, oldest
        first, stopping at the first one ``accept`` refuses (it keeps its place)."""
        with self._cond:
            taken = []
            while self._jobs and len(taken) < max_jobs and accept(self._jobs[0]):
                taken.append(self._jobs.popleft())
            return taken

    def cancel(self, job: Job) -> bool:
        """Remove ``job`` if it is still waiting; True if it was."""
        with self._cond:
            try:
                self._jobs.remove(job)
            except ValueError:
                return False
            return True

    def close(self) -> list[Job]:
        """Refuse new jobs, wake the worker, and return the jobs that were still waiting."""
        with self._cond:
            self._closed = True
            left = list(self._jobs)
            self._jobs.clear()
            self._cond.notify_all()
            return left
