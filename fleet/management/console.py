"""What the build commands share: a tqdm bar as a BuildProgress, running a job in-process or
watching one on Celery, and the JSON summary as the last stdout line."""

from __future__ import annotations

import json
import sys
import time

from django.core.management.base import CommandError
from tqdm import tqdm

from fleet.models import BuildJob
from fleet.services import jobs

WATCH_SECONDS = 0.5
REAP_EVERY = 10  # watch polls between checks that the job's process is still alive


class TqdmProgress:
    """A BuildProgress drawing a tqdm bar (stderr): steps with their ETA, and after them the
    conversations synthesised, their coverage of the corpus, the running and held-out loss."""

    def __init__(self, description: str):
        self.bar = tqdm(desc=description, unit="step", file=sys.stderr, dynamic_ncols=True)
        self.status: dict[str, str] = {}

    def on_step(self, step: int, total: int, loss: float | None) -> None:
        if self.bar.total != total:
            self.bar.reset(total=total)
        self.bar.n = step
        if loss is not None:
            self._show(loss=f"{loss:.4f}")
        self.bar.refresh()

    def on_conversations(self, count: int, coverage: float) -> None:
        self._show(conversations=str(count), coverage=f"{coverage:.1f}x")

    def on_held_out(self, step: int, loss: float) -> None:
        self._show(held_out=f"{loss:.4f}")

    def on_log(self, message: str) -> None:
        self.bar.write(message, file=sys.stderr)

    def cancelled(self) -> bool:
        return False

    def _show(self, **fields: str) -> None:
        self.status.update(fields)
        self.bar.set_postfix(self.status)

    def close(self) -> None:
        self.bar.close()


def run_job(job: BuildJob, use_celery: bool, run_inline, description: str) -> BuildJob:
    """Run ``job`` here (``run_inline(job_id, echo=progress)``) or on Celery, watching its row,
    with a progress bar either way; Ctrl-C cancels it."""
    progress = TqdmProgress(description)
    try:
        if use_celery:
            try:
                jobs.start(job, "celery")
            except jobs.JobError as exc:
                raise CommandError(str(exc)) from exc
            return _watch(job.pk, progress)
        BuildJob.objects.filter(pk=job.pk).update(runner="in-process")
        return run_inline(job.pk, echo=progress)
    except KeyboardInterrupt:
        _cancel_quietly(job.pk, stopped_here=not use_celery)
        raise CommandError(f"interrupted: job #{job.pk} cancelled") from None
    finally:
        progress.close()


def _watch(job_id: int, progress: TqdmProgress) -> BuildJob:
    """Follow a job some worker runs until it ends, mirroring its row on the bar."""
    seen_log = 0
    polls = 0
    while True:
        if polls % REAP_EVERY == 0:
            jobs.fail_orphans()  # a worker killed on this host would leave the row running forever
        polls += 1
        job = BuildJob.objects.get(pk=job_id)
        if job.total:
            progress.on_step(job.step, job.total, job.loss)
        if job.conversations:
            progress.on_conversations(job.conversations, job.coverage)
        if job.held_out_loss is not None:
            progress.on_held_out(job.step, job.held_out_loss)
        lines = job.log.splitlines()
        for line in lines[seen_log:]:
            progress.on_log(line)
        seen_log = len(lines)
        if job.is_finished:
            return job
        time.sleep(WATCH_SECONDS)


def _cancel_quietly(job_id: int, stopped_here: bool) -> None:
    """Ask the job to stop; a job that ran in this process has stopped already: say so."""
    try:
        jobs.cancel(job_id)
    except jobs.JobError:
        pass
    if stopped_here:
        BuildJob.objects.filter(pk=job_id, state=BuildJob.State.RUNNING).update(
            state=BuildJob.State.CANCELLED, error="interrupted (Ctrl-C in the command)"
        )


def finish(job: BuildJob, stdout) -> None:
    """The job's JSON summary as the last stdout line, or CommandError saying why it did not
    succeed."""
    if job.state != BuildJob.State.SUCCEEDED:
        raise CommandError(f"job #{job.pk} {job.state}: {job.error}")
    stdout.write(json.dumps(job.result))
