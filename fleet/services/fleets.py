"""The fleet build job: ``fleet.fleets.build.build_fleet`` with the job row as its progress, its
per-document work fanned out to Celery when asked, and the Fleet and Document rows it leaves.

``fleet.fleets`` (the directory format, the builder, retrieval) is Django-free and imported only
when a fleet job runs or a fleet is recorded.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from django.db import transaction

from fleet.models import BuildJob, Document, Fleet

from . import jobs
from .progress import JobProgress


def _builder():
    try:
        from fleet.fleets import build
    except ImportError as exc:
        raise RuntimeError(f"fleet building is not available in this installation ({exc})") from exc
    return build


def spec_from_parameters(parameters: dict):
    """The FleetBuildSpec back from a job's parameters (unknown keys refused)."""
    spec_type = _builder().FleetBuildSpec
    fields = {f.name: f for f in dataclasses.fields(spec_type)}
    unknown = set(parameters) - set(fields)
    if unknown:
        raise ValueError(f"unknown fleet build parameters: {', '.join(sorted(unknown))}")
    values = {k: Path(v) if k in ("docs_dir", "out", "model") else v for k, v in parameters.items()}
    return spec_type(**values)


def create_fleet_job(parameters: dict) -> BuildJob:
    """A queued job that builds the fleet ``parameters`` describe (FleetBuildSpec's fields)."""
    spec_from_parameters(parameters)  # refuse bad parameters before anything is queued
    return jobs.create_job(BuildJob.Kind.FLEET, parameters)


def run_fleet_job(job_id: int, celery_fanout: bool | None = None, echo=None) -> BuildJob:
    """Run the queued fleet job ``job_id`` to its end (see jobs.run_claimed). ``celery_fanout``:
    send the per-document work to Celery workers as a group (default: when a broker is
    configured); otherwise it runs here. On success the Fleet and Document rows are recorded."""
    if celery_fanout is None:
        celery_fanout = jobs.broker_configured()
    build = functools.partial(_build, celery_fanout=celery_fanout)
    return jobs.run_claimed(job_id, build, lambda job: JobProgress(job, echo=echo))


def _build(job: BuildJob, progress: JobProgress, celery_fanout: bool) -> dict:
    builder = _builder()
    spec = spec_from_parameters(job.parameters)
    mapper = None
    if celery_fanout:
        from .celery_fanout import celery_map

        def on_done(done: int, total: int) -> None:
            progress.on_step(done, total, None)

        mapper = functools.partial(celery_map, on_done=on_done, cancelled=progress.cancelled)
    where = "on Celery workers" if mapper else "in-process"
    progress.on_log(f"building fleet {spec.out} from {spec.docs_dir}; per-document work {where}")
    result = builder.build_fleet(spec, progress, mapper=mapper)
    record_fleet(result.path, spec.model, job)
    return result.as_dict()


def record_fleet(directory: str | Path, model: str | Path = "", job: BuildJob | None = None) -> Fleet:
    """Create or update the Fleet row of a fleet directory and its Document rows from the
    directory's own manifest."""
    from fleet.fleets.format import read_manifest

    directory = Path(directory).resolve()
    manifest = read_manifest(directory)
    # Every file is read before the rows change, and the rows change together: a fleet whose
    # cartridge went missing keeps the rows it had rather than losing its documents.
    documents = [
        Document(
            name=doc.name,
            tokens=doc.tokens,
            steps=doc.steps,
            cartridge_file=doc.cartridge,
            cartridge_bytes=(directory / doc.cartridge).stat().st_size,
            chunks=doc.chunks,
        )
        for doc in manifest.documents
    ]
    with transaction.atomic():
        fleet, _ = Fleet.objects.update_or_create(
            directory=str(directory),
            defaults={
                "model_path": str(model),
                "model_fingerprint": manifest.model_fingerprint,
                "prefix_tokens": manifest.p,
                "documents_count": len(manifest.documents),
                "chunks": sum(doc.chunks for doc in manifest.documents),
                "steps": manifest.steps,
                "job": job,
            },
        )
        fleet.documents.all().delete()
        for document in documents:
            document.fleet = fleet
        Document.objects.bulk_create(documents)
    return fleet
