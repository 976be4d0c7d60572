"""What the admin's actions do: start a build from an uploaded corpus, query a fleet."""

from __future__ import annotations

import threading
import uuid
from functools import lru_cache
from pathlib import Path

from django.conf import settings

from fleet.cartridges.build import CartridgeBuildSpec
from fleet.models import BuildJob, Cartridge, Fleet
from inference.model_files import resolve_model

from . import jobs
from .cartridges import create_cartridge_job


class BuildRequestError(ValueError):
    """A build the admin asked for that cannot start (says why)."""


def start_cartridge_build(upload, name: str, model: str, **options) -> BuildJob:
    """Keep the uploaded corpus under LMSERVE_BUILD_DIR, queue a job writing ``<name>.safetensors``
    there and start it (Celery when a broker is configured, else a thread of this process)."""
    root = Path(settings.LMSERVE_BUILD_DIR)
    out = (root / "cartridges" / f"{name}.safetensors").resolve()
    if out.exists() or Cartridge.objects.filter(path=str(out)).exists():
        raise BuildRequestError(f"a cartridge named {name} exists already")
    building = BuildJob.objects.filter(
        kind="cartridge", state__in=["queued", "running"], parameters__out=str(out)
    )
    if building.exists():
        raise BuildRequestError(f"a build of {name} is already queued or running")
    try:
        model_path = resolve_model(model).resolve()
    except LookupError as exc:
        raise BuildRequestError(str(exc)) from exc
    kept = root / "corpora" / uuid.uuid4().hex[:12]  # one directory per upload keeps its own name
    kept.mkdir(parents=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    corpus = kept / Path(upload.name).name
    with corpus.open("wb") as fh:
        for chunk in upload.chunks():
            fh.write(chunk)
    spec = CartridgeBuildSpec(corpus=corpus, out=out, model=model_path, **options)
    try:
        return jobs.start(create_cartridge_job(spec))
    except jobs.JobError as exc:
        raise BuildRequestError(str(exc)) from exc


_engine_lock = threading.Lock()


@lru_cache(maxsize=2)
def _engine(model: str):
    from inference.engine.engine import Engine

    return Engine.load(model)


def query_fleet(fleet: Fleet, text: str, rag_chunks: int, rag_docs: int):
    """What retrieval makes of ``text`` on ``fleet`` (``fleet.fleets.retrieval.try_query``), with
    an engine of the fleet's model loaded once for the admin (memory-mapped: the weights' pages
    are shared with the server's own engine)."""
    try:
        from fleet.fleets.retrieval import try_query
    except ImportError as exc:
        raise BuildRequestError(f"fleet retrieval is not available in this installation ({exc})") from exc
    if not fleet.model_path:
        raise BuildRequestError(f"fleet {fleet} does not record the model it was built with")
    with _engine_lock:  # one query at a time: an engine's scratch buffers are not shared
        return try_query(
            fleet.directory, _engine(fleet.model_path), text, rag_chunks=rag_chunks, rag_docs=rag_docs
        )
