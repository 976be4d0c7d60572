"""Celery tasks: thin over the services (``celery -A lmserve_site.celery worker``).

A build task takes the job's id; the job row holds its parameters and receives its progress, so
a task is the same build the command runs in-process. ``document_item`` runs one item of a fleet
build's fan-out (fleet/services/fanout.py).
"""

from __future__ import annotations

from lmserve_site.celery import app


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
