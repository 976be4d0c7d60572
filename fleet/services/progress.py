"""A :class:`~fleet.cartridges.build.BuildProgress` that writes to the job's row while it runs.

Writes are throttled (at most one per ``interval`` seconds, plus the last step) and go through
``UPDATE ... WHERE pk`` of the progress fields only, so the admin's cancel request, written
concurrently, is never overwritten. ``cancelled()`` re-reads that flag at the same pace.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from fleet.models import BuildJob


class JobProgress:
    """Progress of one build job: step, total, running loss, the self-study conversations and
    their coverage, the latest held-out loss, both loss histories and the log."""

    def __init__(self, job: BuildJob, interval: float = 0.5, echo=None, clock=time.monotonic):
        """``echo``: another BuildProgress told everything too (the command's tqdm bar)."""
        self.job_id = job.pk
        self.interval = interval
        self.echo = echo
        self.clock = clock
        self.step = self.total = 0
        self.loss: float | None = None
        self.losses: list[list[float]] = []  # [[step, loss], ...]: the cartridge's loss curve
        self.held_out: list[list[float]] = []  # [[step, held-out loss], ...]
        self.conversations = 0
        self.coverage = 0.0
        self.lines: list[str] = [job.log] if job.log else []
        self._last_write = self._last_poll = float("-inf")
        self._cancel = False

    def on_step(self, step: int, total: int, loss: float | None) -> None:
        self.step, self.total = step, total
        if loss is not None:
            self.loss = float(loss)
            self.losses.append([step, self.loss])
        if self.echo is not None:
            self.echo.on_step(step, total, loss)
        self._write(force=step >= total)

    def on_conversations(self, count: int, coverage: float) -> None:
        self.conversations, self.coverage = count, float(coverage)
        if self.echo is not None:
            self.echo.on_conversations(count, coverage)
        self._write()

    def on_held_out(self, step: int, loss: float) -> None:
        self.held_out.append([step, float(loss)])
        if self.echo is not None:
            self.echo.on_held_out(step, loss)
        self._write(force=True)

    def on_log(self, message: str) -> None:
        self.lines.append(f"{datetime.now(UTC):%H:%M:%S} {message}")
        if self.echo is not None:
            self.echo.on_log(message)
        self._write()

    def cancelled(self) -> bool:
        now = self.clock()
        if not self._cancel and now - self._last_poll >= self.interval:
            self._last_poll = now
            self._cancel = BuildJob.objects.filter(pk=self.job_id, cancel_requested=True).exists()
        return self._cancel or (self.echo is not None and self.echo.cancelled())

    def flush(self) -> None:
        """Write whatever is not written yet."""
        self._write(force=True)

    @property
    def log_text(self) -> str:
        return "\n".join(self.lines)

    def _write(self, force: bool = False) -> None:
        now = self.clock()
        if not force and now - self._last_write < self.interval:
            return
        self._last_write = now
        fraction = min(1.0, self.step / self.total) if self.total else 0.0
        BuildJob.objects.filter(pk=self.job_id).update(
            step=self.step,
            total=self.total,
            progress=fraction,
            loss=self.loss,
            conversations=self.conversations,
            coverage=self.coverage,
            held_out_loss=self.held_out[-1][1] if self.held_out else None,
            log=self.log_text,
        )
