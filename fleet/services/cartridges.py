"""The cartridge build job: ``build_cartridge`` with the job row as its progress, and the
Cartridge row it leaves behind."""

from __future__ import annotations

import hashlib
from pathlib import Path

from safetensors import safe_open

from fleet.cartridges.build import CartridgeBuildSpec, build_cartridge
from fleet.models import BuildJob, Cartridge

from . import jobs
from .progress import JobProgress

SPEC_FIELDS = (
    "corpus",
    "out",
    "model",
    "prefix_tokens",
    "steps",
    "minutes",
    "dataset",
    "synthesis_share",
    "lr",
    "seed",
    "frozen_rows",
)
PATH_FIELDS = ("corpus", "out", "model", "dataset")


def cartridge_parameters(spec: CartridgeBuildSpec) -> dict:
    """The job's JSON parameters for ``spec`` (paths as strings)."""
    return {name: str(v) if isinstance(v, Path) else v for name in SPEC_FIELDS for v in [getattr(spec, name)]}


def spec_from_parameters(parameters: dict) -> CartridgeBuildSpec:
    """The build spec back from a job's parameters (unknown keys refused)."""
    unknown = set(parameters) - set(SPEC_FIELDS)
    if unknown:
        raise ValueError(f"unknown cartridge build parameters: {', '.join(sorted(unknown))}")
    values = dict(parameters)
    for name in PATH_FIELDS:
        if values.get(name) is not None:
            values[name] = Path(values[name])
    return CartridgeBuildSpec(**values)


def create_cartridge_job(spec: CartridgeBuildSpec) -> BuildJob:
    """A queued job that builds ``spec``."""
    return jobs.create_job(BuildJob.Kind.CARTRIDGE, cartridge_parameters(spec))


def run_cartridge_job(job_id: int, echo=None) -> BuildJob:
    """Run the queued cartridge job ``job_id`` to its end (see jobs.run_claimed); on success the
    Cartridge row for its file is created or updated. ``echo``: another progress to tell (tqdm)."""
    return jobs.run_claimed(job_id, _build, lambda job: JobProgress(job, echo=echo))


def _build(job: BuildJob, progress: JobProgress) -> dict:
    spec = spec_from_parameters(job.parameters)
    budget = f"{spec.minutes:g} minutes" if spec.minutes else f"{spec.steps} steps"
    progress.on_log(f"building {spec.out} from {spec.corpus} ({budget}, p={spec.prefix_tokens})")
    result = build_cartridge(spec, progress)
    record_cartridge(spec, result.as_dict(), progress.losses, job, progress.held_out)
    return result.as_dict()


def record_cartridge(
    spec: CartridgeBuildSpec, result: dict, losses: list, job: BuildJob | None, held_out: list
) -> Cartridge:
    """Create or update the Cartridge row of the file a build wrote (fingerprint and rows read
    from the file's own metadata); ``losses`` and ``held_out`` are its ``[[step, loss], ...]``
    training and held-out curves."""
    with safe_open(result["path"], framework="numpy") as f:
        meta = f.metadata() or {}
    digest = hashlib.sha256(spec.corpus.read_bytes()).hexdigest()
    cartridge, _ = Cartridge.objects.update_or_create(
        path=str(Path(result["path"]).resolve()),
        defaults={
            "model_path": str(spec.model),
            "model_fingerprint": meta.get("model_fingerprint", ""),
            "rows": int(meta.get("rows", result["rows"])),
            "corpus_name": spec.corpus.name,
            "corpus_digest": digest,
            "status": Cartridge.Status.READY,
            "steps": result["steps"],
            "loss_history": losses,
            "held_out_history": held_out,
            "loss_first": result.get("loss_first"),
            "loss_last": result.get("loss_last"),
            "job": job,
        },
    )
    return cartridge
