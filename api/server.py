"""Running the ASGI application under daphne with lmserve's lifecycle.

On top of daphne's Server: print the bound address (``--port 0`` picks a free port), and on
SIGINT/SIGTERM drain — stop listening, fail queued and in-flight work with a 503 (in-band
for streams already started), wait until every open response has been written out, then
stop. A second signal stops at once. A model that fails to load stops the server with an
error.
"""

from __future__ import annotations

import logging
import signal
import sys
import time

from daphne.endpoints import build_endpoint_description_strings
from daphne.server import Server
from twisted.internet import reactor

from api.http_guard import GuardedHTTPFactory
from inference.runtime.service import InferenceService

logger = logging.getLogger("lmserve.server")

DRAIN_TIMEOUT = 10.0  # seconds to let open responses finish after a shutdown signal
DRAIN_POLL = 0.05


class LmserveServer(Server):
    """daphne's Server plus address announcement, graceful drain and load-failure exit."""

    def __init__(self, application, service: InferenceService, host: str, port: int, **kwargs):
        endpoints = build_endpoint_description_strings(host=host, port=port)
        super().__init__(
            application,
            endpoints=endpoints,
            signal_handlers=False,
            ready_callable=self._install_signal_handlers,
            action_logger=_log_access,
            **kwargs,
        )
        self.service = service
        self.ports = []
        self.failure: str | None = None
        self._drain_deadline: float | None = None

    @property
    def http_factory(self):
        return self._http_factory

    @http_factory.setter
    def http_factory(self, factory) -> None:
        # daphne's run() builds its HTTPFactory inline; this is the seam where ours replaces it
        # (requests refused from their head, bodies bounded as they arrive: api/http_guard.py).
        self._http_factory = GuardedHTTPFactory(self)

    def listen_success(self, port):
        self.ports.append(port)
        address = port.getHost()
        # Printed, not logged: scripts and tests read the bound port from this line.
        print(f"lmserve: serving {self.service.model_id} on http://{address.host}:{address.port}", flush=True)
        return super().listen_success(port)

    def fail(self, message: str) -> None:
        """Stop serving because the server cannot work (the model did not load)."""
        self.failure = message
        self.stop()

    # -- shutdown --------------------------------------------------------------------------
    def _install_signal_handlers(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        # Runs between bytecodes of the reactor thread: hand the work to the reactor.
        reactor.callFromThread(self.begin_drain, signal.Signals(signum).name)

    def begin_drain(self, reason: str = "shutdown") -> None:
        if self._drain_deadline is not None:
            logger.warning("second %s: stopping now", reason)
            self.stop()
            return
        logger.info("%s: draining (no new connections, cancelling in-flight work)", reason)
        self._drain_deadline = time.monotonic() + DRAIN_TIMEOUT
        for port in self.ports:
            port.stopListening()
        self.service.shutdown()
        self._check_drained()

    def _check_drained(self) -> None:
        idle = self.service.idle and self.service.connections.open == 0
        if idle or time.monotonic() >= self._drain_deadline:
            if not idle:
                logger.warning("drain timeout: %d responses still open", self.service.connections.open)
            self.stop()
            return
        reactor.callLater(DRAIN_POLL, self._check_drained)


def _log_access(protocol, action, details) -> None:
    if protocol == "http" and action == "complete":
        quiet = details["path"].rstrip("/").endswith("/health")  # probes would drown the log
        logger.log(
            logging.DEBUG if quiet else logging.INFO,
            "%s %s %s %.3fs",
            details["method"],
            details["path"],
            details["status"],
            details["time_taken"],
        )


def serve(application, service: InferenceService, host: str, port: int) -> int:
    """Serve until drained; the process exit status (0 after a signal, 1 if the model failed)."""
    server = LmserveServer(application, service, host, port)
    service.worker.on_failure = lambda message: reactor.callFromThread(server.fail, message)
    service.start()
    server.run()
    if not server.ports and not server.failure:
        server.failure = f"could not listen on {host}:{port}"
    service.shutdown()
    service.worker.join(timeout=DRAIN_TIMEOUT)
    if server.failure:
        print(f"lmserve: {server.failure}", file=sys.stderr, flush=True)
        return 1
    return 0
