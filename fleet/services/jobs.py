"""Build jobs: create, start (in this process, in a thread, or on Celery), run, cancel.

A job's lifecycle is one row: ``queued`` -> ``running`` (claimed atomically, so a redelivered
Celery message or a second runner does nothing) -> ``succeeded`` / ``failed`` / ``cancelled``,
with the reason in ``error``. Each kind's service function (``run_cartridge_job``,
``run_fleet_job``) runs the build between :func:`claim` and :func:`finish`; the kinds are
registered by ``FleetConfig.ready`` (:func:`register`), so this module imports none of them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone
from django.utils.module_loading import import_string

from fleet.models import BuildJob

log = logging.getLogger("lmserve.fleet")

State = BuildJob.State


class JobError(ValueError):
    """A request about a job that cannot be honoured (says why)."""


@dataclass(frozen=True)
class JobKind:
    """How one kind of build job runs: its service function (a dotted path, imported when a job
    of the kind runs: what every runner ends in) and the name of the Celery task that calls
    it on a worker."""

    run: str
    task: str


KINDS: dict[str, JobKind] = {}


def register(kind: str, job_kind: JobKind) -> None:
    """Make ``kind`` runnable (``FleetConfig.ready`` registers the fleet's two)."""
    KINDS[kind] = job_kind


def _kind(kind: str) -> JobKind:
    try:
        return KINDS[kind]
    except KeyError:
        raise JobError(f"no runner is registered for build jobs of kind {kind!r}") from None


def broker_configured() -> bool:
    """Whether builds can go to Celery workers (``CELERY_BROKER_URL`` set)."""
    return bool(getattr(settings, "CELERY_BROKER_URL", ""))


def create_job(kind: str, parameters: dict) -> BuildJob:
    """A queued job with its parameters (JSON-able: paths as strings)."""
    return BuildJob.objects.create(kind=kind, parameters=parameters)


def start(job: BuildJob, runner: str = "auto") -> BuildJob:
    """Run ``job`` by ``runner``: ``celery`` (a task on a worker; needs a broker), ``thread`` (a
    background thread of this process), ``inline`` (now, returning when it ends) or ``auto``
    (celery when a broker is configured, else a thread)."""
    if runner == "auto":
        runner = "celery" if broker_configured() else "thread"
    if runner == "celery":
        if not broker_configured():
            raise JobError("no Celery broker is configured: set CELERY_BROKER_URL (e.g. redis://host:6379/0)")
        from lmserve_site.celery import app

        task = _kind(job.kind).task
        BuildJob.objects.filter(pk=job.pk).update(runner="celery")
        result = app.send_task(task, args=[job.pk])
        BuildJob.objects.filter(pk=job.pk).update(celery_task_id=result.id)
    elif runner == "thread":
        BuildJob.objects.filter(pk=job.pk).update(runner="thread")
        job.refresh_from_db()  # before the thread writes the row (SQLite's shared cache fails a clash)
        threading.Thread(
            target=_run_in_thread, args=(job.pk,), name=f"build-job-{job.pk}", daemon=True
        ).start()
        return job
    elif runner == "inline":
        run(job.pk)
    else:
        raise JobError(f"unknown runner {runner!r}")
    job.refresh_from_db()
    return job


def run(job_id: int) -> BuildJob:
    """Run the job by its kind's service function (what every runner ends up calling)."""
    kind = BuildJob.objects.values_list("kind", flat=True).get(pk=job_id)
    return import_string(_kind(kind).run)(job_id)


def _run_in_thread(job_id: int) -> None:
    close_old_connections()
    try:
        run(job_id)
    except Exception:  # run() records failures on the row; this is a bug in the recording itself
        log.exception("build job %s crashed", job_id)
    finally:
        connection.close()  # the thread's own connection


def cancel(job_id: int) -> str:
    """Cancel a queued job at once (``cancelled``) or ask a running one to stop at its next check
    (``requested``); JobError when it has already finished."""
    now = timezone.now()
    queued = BuildJob.objects.filter(pk=job_id, state=State.QUEUED)
    if queued.update(
        state=State.CANCELLED, cancel_requested=True, error="cancelled before it started", finished=now
    ):
        _revoke(job_id)
        return "cancelled"
    if BuildJob.objects.filter(pk=job_id, state=State.RUNNING).update(cancel_requested=True):
        return "requested"
    job = BuildJob.objects.filter(pk=job_id).first()
    if job is None:
        raise JobError(f"no build job #{job_id}")
    raise JobError(f"job #{job_id} has already finished ({job.state})")


def _revoke(job_id: int) -> None:
    task_id = BuildJob.objects.values_list("celery_task_id", flat=True).get(pk=job_id)
    if task_id and broker_configured():
        from lmserve_site.celery import app

        app.control.revoke(task_id)  # a courtesy: the task also finds the job cancelled and returns


def _process() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def claim(job_id: int) -> BuildJob | None:
    """Move a queued job to running, recording the process that runs it; None when it is not
    queued any more (cancelled, or taken by another runner)."""
    if not BuildJob.objects.filter(pk=job_id, state=State.QUEUED).update(
        state=State.RUNNING, started=timezone.now(), process=_process()
    ):
        return None
    return BuildJob.objects.get(pk=job_id)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    # A killed worker's pool process stays a zombie until something reaps it, and signal 0
    # reaches a zombie: an init that is slow to reap (a VM's) kept such jobs "running".
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc (not Linux), or it ended meanwhile: signal 0 is all we know
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


def fail_orphans() -> int:
    """Mark failed the running jobs whose process on this host has ended (a server restarted
    under its build thread, a killed command or worker): nothing else would ever end them.
    Returns how many. Run when a Celery worker starts, while a command watches a job, and when
    the admin's job pages are read."""
    host = socket.gethostname()
    orphans = 0
    for job_id, process in BuildJob.objects.filter(state=State.RUNNING).values_list("pk", "process"):
        name, _, pid = process.rpartition(":")
        if name == host and pid.isdigit() and not _alive(int(pid)):
            orphans += fail_lost(job_id, f"the process running it ({process}) ended before the build did")
    return orphans


def fail_lost(job_id: int, why: str) -> int:
    """Mark a running job failed because the process running it is gone ("worker lost: why");
    1 when it was running, else 0 (it had ended already)."""
    return BuildJob.objects.filter(pk=job_id, state=State.RUNNING).update(
        state=State.FAILED, error=f"worker lost: {why}", finished=timezone.now()
    )


def finish(job_id: int, state: str, *, error: str = "", result: dict | None = None, log_text=None) -> None:
    """Record the end of a running job."""
    fields = {"state": state, "error": error, "result": result, "finished": timezone.now()}
    if state == State.SUCCEEDED:
        fields["progress"] = 1.0
    if log_text is not None:
        fields["log"] = log_text
    BuildJob.objects.filter(pk=job_id).update(**fields)


def run_claimed(job_id: int, build: Callable[[BuildJob], dict], progress_factory) -> BuildJob:
    """Claim the job, run ``build(job, progress)`` and record how it ended: its result on success,
    ``cancelled`` with the reason on BuildCancelled, ``failed`` with the error otherwise (bad input
    included: the message names the problem)."""
    from fleet.cartridges.build import BuildCancelled

    from .fanout import Cancelled

    job = claim(job_id)
    if job is None:
        return BuildJob.objects.get(pk=job_id)
    progress = progress_factory(job)
    try:
        result = build(job, progress)
    except (BuildCancelled, Cancelled) as exc:
        progress.on_log(f"cancelled: {exc}")
        progress.flush()
        finish(job_id, State.CANCELLED, error=f"cancelled on request: {exc}", log_text=progress.log_text)
    except Exception as exc:
        progress.lines.append(traceback.format_exc().rstrip())
        progress.flush()
        finish(job_id, State.FAILED, error=f"{type(exc).__name__}: {exc}", log_text=progress.log_text)
    else:
        progress.on_log("done")
        progress.flush()
        finish(job_id, State.SUCCEEDED, result=result, log_text=progress.log_text)
    return BuildJob.objects.get(pk=job_id)
