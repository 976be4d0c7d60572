"""Celery tasks: thin over the services (``celery -A lmserve_site.celery worker``).

A build task takes the job's id; the job row holds its parameters and receives its progress, so
a task is the same build the command runs in-process. ``document_item`` runs one item of a fleet
build's fan-out (fleet/services/fanout.py).

A build whose worker dies cannot record its own end, so the worker does it for it: the pool's
parent marks the job failed when the child running it is lost (``kill -9``, the OOM killer), and
a starting worker fails the running jobs whose process on this host is gone (the whole worker
was killed). A redelivered message finds its job no longer queued and does nothing: a build is
run again by starting it again, which resumes from its dataset's shards.
"""

from __future__ import annotations

from billiard.exceptions import WorkerLostError
from celery.signals import task_failure, worker_ready

from lmserve_site.celery import app

BUILD_TASKS = ("fleet.build_cartridge", "fleet.build_fleet")


@app.task(name="fleet.build_cartridge")
def build_cartridge(job_id: int) -> str:
    """Run cartridge job ``job_id``; returns its final state."""
    from fleet.services.cartridges import run_cartridge_job

    return run_cartridge_job(job_id).state


@app.task(name="fleet.build_fleet")
def build_fleet(job_id: int) -> str:
    """Run fleet job ``job_id`` with its per-document work fanned out to the workers."""
    from fleet.services.fleets import run_fleet_job

    return run_fleet_job(job_id, celery_fanout=True).state


@app.task(name="fleet.document_item")
def document_item(name: str, item):
    """One item of a fan-out: the document task ``name`` applied to ``item``."""
    from fleet.services.fanout import resolve

    return resolve(name)(item)


@task_failure.connect
def _fail_lost_build(sender=None, exception=None, args=None, **_):
    """In the worker's parent process: a build whose pool child died is failed, saying so."""
    if isinstance(exception, WorkerLostError) and getattr(sender, "name", "") in BUILD_TASKS and args:
        from fleet.services.jobs import fail_lost

        fail_lost(args[0], str(exception))


@worker_ready.connect
def _fail_orphans_on_start(**_):
    """Builds left running by a worker that was killed whole end as failed when one starts."""
    from fleet.services.jobs import fail_orphans

    fail_orphans()
