"""``python manage.py build_cartridge CORPUS --out F``: build a cartridge from a text corpus.

In-process by default (no broker needed), with a tqdm bar and the running loss on stderr;
``--celery`` sends the job to a Celery worker and follows it. Either way a BuildJob row records
it, and the last stdout line is the JSON summary (path, rows, steps, loss_first, loss_last,
seconds).
"""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from fleet.cartridges.build import CartridgeBuildSpec
from fleet.cartridges.train import DEFAULT_LR
from fleet.management import console
from fleet.services.cartridges import create_cartridge_job, run_cartridge_job
from inference.model_files import ModelFileError, resolve_model


class Command(BaseCommand):
    help = "Build a cartridge (a trained KV prefix) from a corpus file."

    def add_arguments(self, parser):
        parser.add_argument("corpus", help="the corpus: a UTF-8 text file")
        parser.add_argument("--out", required=True, help="the cartridge file to write (.safetensors)")
        parser.add_argument("--model", default="", help="GGUF path or model name (default: SmolLM2)")
        parser.add_argument("--prefix-tokens", type=int, default=256, help="p, the cartridge's rows (256)")
        parser.add_argument("--steps", type=int, default=0, help="training steps; 0 = untrained (0)")
        parser.add_argument(
            "--minutes",
            type=float,
            default=0.0,
            help="time budget for synthesis and training; the best held-out checkpoint is saved (0 = none)",
        )
        parser.add_argument(
            "--dataset", default="", help="self-study dataset directory to read, resume and extend (none)"
        )
        parser.add_argument(
            "--synthesis-share",
            type=float,
            default=0.4,
            help="of --minutes, the part spent synthesising; 0: train on what --dataset holds (0.4)",
        )
        parser.add_argument("--lr", type=float, default=DEFAULT_LR, help=f"learning rate ({DEFAULT_LR:g})")
        parser.add_argument("--seed", type=int, default=0, help="seed of the self-study sampling (0)")
        parser.add_argument("--frozen-rows", type=int, default=1, help="leading rows kept frozen (1)")
        parser.add_argument(
            "--celery", action="store_true", help="run on a Celery worker (CELERY_BROKER_URL)"
        )

    def handle(self, *args, **opts):
        corpus, out = Path(opts["corpus"]), Path(opts["out"])
        if not corpus.is_file():
            raise CommandError(f"{corpus}: no such corpus file")
        if not out.parent.is_dir():
            raise CommandError(f"{out.parent}: the output's directory does not exist")
        if opts["prefix_tokens"] < 1 or opts["steps"] < 0 or opts["frozen_rows"] < 0 or opts["lr"] <= 0:
            raise CommandError("--prefix-tokens must be >= 1, --steps and --frozen-rows >= 0, --lr > 0")
        if opts["minutes"] < 0:
            raise CommandError(f"--minutes {opts['minutes']:g} must be 0 or more")
        if not 0 <= opts["synthesis_share"] < 1:
            raise CommandError(f"--synthesis-share {opts['synthesis_share']:g} must be within [0, 1)")
        dataset = Path(opts["dataset"]).resolve() if opts["dataset"] else None
        if dataset is not None and dataset.exists() and not dataset.is_dir():
            raise CommandError(f"{opts['dataset']}: --dataset must be a directory")
        try:
            model = resolve_model(opts["model"])
        except ModelFileError as exc:
            raise CommandError(str(exc)) from exc
        spec = CartridgeBuildSpec(
            corpus=corpus.resolve(),
            out=out.resolve(),
            model=Path(model).resolve(),
            prefix_tokens=opts["prefix_tokens"],
            steps=opts["steps"],
            minutes=opts["minutes"],
            dataset=dataset,
            lr=opts["lr"],
            synthesis_share=opts["synthesis_share"],
            seed=opts["seed"],
            frozen_rows=opts["frozen_rows"],
        )
        job = create_cartridge_job(spec)
        job = console.run_job(job, opts["celery"], run_cartridge_job, f"cartridge {out.name}")
        console.finish(job, self.stdout)
