"""StreamPipe: the one-way channel from the worker thread to one request's connection.

The worker pushes events and never waits; the connection (an asyncio task) awaits them. The
buffer is unbounded on purpose: a client that reads nothing keeps its own reply here (bounded
by its max_tokens) while generation and every other request run at full speed.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque

from inference.types import Embeddings, Error, Event, Finish, TextDelta


class StreamPipe:
    """Events for one request. ``push``/``close`` from any thread; ``get`` from the owning loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._lock = threading.Lock()
        self._events: deque[Event] = deque()
        self._closed = False
        self._cancelled = threading.Event()
        self._wakeup = asyncio.Event()
        # The fleet documents whose cartridges the worker composed as this request's KV
        # prefix (set before any event; read by the connection for the response headers).
        self.documents: tuple[str, ...] = ()
        self.prefix_known = False

    # -- producer side (worker thread) -------------------------------------------------------
    @property
    def cancelled(self) -> bool:
        """True once the consumer went away or the server aborted the request."""
        return self._cancelled.is_set()

    @property
    def closed(self) -> bool:
        return self._closed

    def push(self, event: Event) -> None:
        """Append an event; ignored once the pipe is closed. Never blocks."""
        with self._lock:
            if self._closed:
                return
            self._events.append(event)
            if isinstance(event, (Finish, Error, Embeddings)):
                self._closed = True
        self._wake()

    def prefix_chosen(self, documents: tuple[str, ...]) -> None:
        """The worker chose the request's KV prefix, composed of ``documents`` (maybe none)."""
        with self._lock:
            self.documents = tuple(documents)
            self.prefix_known = True

    def close(self, final: Finish | Error | Embeddings) -> None:
        """Push the terminal event; later pushes are dropped."""
        self.push(final)

    def abort(self, error: Error) -> None:
        """Fail the request from outside the worker (shutdown): the consumer gets ``error`` at
        once and the worker stops at its next token."""
        self._cancelled.set()
        self.push(error)

    # -- consumer side (event loop) ----------------------------------------------------------
    def cancel(self) -> None:
        """The consumer is gone: the worker stops generating at its next token."""
        self._cancelled.set()

    async def get(self) -> Event | None:
        """The next event; consecutive text deltas already buffered arrive merged as one.
        ``None`` after the terminal event has been returned."""
        while True:
            self._wakeup.clear()
            with self._lock:
                if self._events:
                    return self._take_locked()
                if self._closed:
                    return None
            await self._wakeup.wait()

    def _take_locked(self) -> Event:
        first = self._events.popleft()
        if not isinstance(first, TextDelta) or not self._events or not isinstance(self._events[0], TextDelta):
            return first
        parts, logprobs = [first.text], [*first.logprobs]
        while self._events and isinstance(self._events[0], TextDelta):
            event = self._events.popleft()
            parts.append(event.text)
            logprobs += event.logprobs
        return TextDelta("".join(parts), tuple(logprobs))

    def _wake(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._wakeup.set)
        except RuntimeError:
            pass  # the loop is closed: the server is gone and nobody is waiting
