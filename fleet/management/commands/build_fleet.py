"""``python manage.py build_fleet DOCS_DIR --out FLEET_DIR``: one cartridge per document plus
the retrieval index.

The build runs in this process with a tqdm bar; ``--celery`` fans the per-document work
(initialisation passes, index embeddings) out to the Celery workers as a group while this
process drives the build. A BuildJob row records it; the last stdout line is the JSON summary
(path, documents, chunks, steps, seconds).
"""

from __future__ import annotations

import functools
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from fleet.cartridges.train import DEFAULT_LR
from fleet.management import console
from fleet.services import jobs
from fleet.services.fleets import create_fleet_job, run_fleet_job
from inference.model_files import ModelFileError, resolve_model


class Command(BaseCommand):
    help = "Build a fleet: one cartridge per document of DOCS_DIR and a retrieval index."

    def add_arguments(self, parser):
        parser.add_argument("docs_dir", help="a directory with one UTF-8 text file per document")
        parser.add_argument("--out", required=True, help="the fleet directory to create (absent or empty)")
        parser.add_argument("--model", default="", help="GGUF path or model name (default: SmolLM2)")
        parser.add_argument("--prefix-tokens", type=int, default=256, help="p of each cartridge (256)")
        parser.add_argument("--steps", type=int, default=0, help="joint-training steps; 0 = untrained (0)")
        parser.add_argument("--embed-chunk", type=int, default=256, help="tokens per index chunk (256)")
        parser.add_argument("--lr", type=float, default=DEFAULT_LR, help=f"learning rate ({DEFAULT_LR})")
        parser.add_argument(
            "--held-out",
            type=int,
            default=8,
            help="held-out conversations per document; each cartridge keeps its best checkpoint (8)",
        )
        parser.add_argument("--seed", type=int, default=0, help="seed (0)")
        parser.add_argument(
            "--celery", action="store_true", help="fan the per-document work out to Celery workers"
        )

    def handle(self, *args, **opts):
        docs, out = Path(opts["docs_dir"]), Path(opts["out"])
        if not docs.is_dir():
            raise CommandError(f"{docs}: no such directory of documents")
        if opts["prefix_tokens"] < 1 or opts["embed_chunk"] < 1 or opts["steps"] < 0 or opts["lr"] <= 0:
            raise CommandError("--prefix-tokens and --embed-chunk must be >= 1, --steps >= 0, --lr > 0")
        if opts["held_out"] < 0:
            raise CommandError("--held-out must be >= 0 (0: each cartridge keeps its last state)")
        if opts["celery"] and not jobs.broker_configured():
            raise CommandError("--celery needs a broker: set CELERY_BROKER_URL (e.g. redis://host:6379/0)")
        try:
            model = resolve_model(opts["model"])
        except ModelFileError as exc:
            raise CommandError(str(exc)) from exc
        parameters = {
            "docs_dir": str(docs.resolve()),
            "out": str(out.resolve()),
            "model": str(Path(model).resolve()),
            "prefix_tokens": opts["prefix_tokens"],
            "steps": opts["steps"],
            "embed_chunk": opts["embed_chunk"],
            "lr": opts["lr"],
            "held_out": opts["held_out"],
            "seed": opts["seed"],
        }
        try:
            job = create_fleet_job(parameters)
        except (RuntimeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        # The build is driven here either way; --celery only moves its per-document items.
        run = functools.partial(run_fleet_job, celery_fanout=opts["celery"])
        job = console.run_job(job, False, run, f"fleet {out.name}")
        console.finish(job, self.stdout)
