"""``python manage.py synthesize_selfstudy CORPUS --dataset DIR``: synthesise self-study
conversations about a corpus into a dataset directory, ready for ``build_cartridge --dataset``.

``--conversations N`` train conversations from index ``--first I`` are cut into ``--shards S``
contiguous ranges, one shard file each; ``--held-out H`` adds held-out conversations 0 .. H-1.
The shards are written in this process by default (a tqdm bar counts conversations on stderr);
``--celery`` sends one task per shard to the Celery workers (CELERY_BROKER_URL), which write their
shards into DIR themselves, so DIR, CORPUS and the model must be at the same paths on every
worker's machine. Rerunning resumes: only missing conversations are made, and ``--first`` extends
the dataset. The last stdout line is the JSON summary (dataset, conversations, held_out, shards,
seconds, made).

The defaults give the self-study settings ``build_cartridge`` synthesises with; a dataset made
with another ``--max-question``/``--max-answer`` is refused by it (its header differs).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from fleet.cartridges.build import BuildCancelled
from fleet.cartridges.selfstudy import SelfStudyConfig
from fleet.management import console
from fleet.services import jobs
from fleet.services.fanout import using
from fleet.services.selfstudy import SynthesisSpec, check_spec, synthesize_dataset
from inference.model_files import ModelFileError, resolve_model

DEFAULTS = SelfStudyConfig()


class Command(BaseCommand):
    help = "Synthesise self-study conversations about a corpus into a (sharded, resumable) dataset."

    def add_arguments(self, parser):
        parser.add_argument("corpus", help="the corpus: a UTF-8 text file")
        parser.add_argument("--dataset", required=True, help="the dataset directory (created, or extended)")
        parser.add_argument("--model", default="", help="GGUF path or model name (default: SmolLM2)")
        parser.add_argument("--conversations", type=int, default=64, help="train conversations (64)")
        parser.add_argument("--first", type=int, default=0, help="index of the first one (0)")
        parser.add_argument(
            "--shards", type=int, default=1, help="shard files (and tasks) to cut them into (1)"
        )
        parser.add_argument("--held-out", type=int, default=0, help="held-out conversations (0)")
        parser.add_argument("--seed", type=int, default=0, help="seed of the self-study sampling (0)")
        parser.add_argument(
            "--max-question",
            type=int,
            default=DEFAULTS.max_question,
            help=f"most tokens of a question ({DEFAULTS.max_question})",
        )
        parser.add_argument(
            "--max-answer",
            type=int,
            default=DEFAULTS.max_answer,
            help=f"most tokens of an answer ({DEFAULTS.max_answer})",
        )
        parser.add_argument("--batch", type=int, default=16, help="conversations decoded together (16)")
        parser.add_argument(
            "--celery",
            action="store_true",
            help="one task per shard on the Celery workers (CELERY_BROKER_URL)",
        )

    def handle(self, *args, **opts):
        if opts["max_question"] < 1 or opts["max_answer"] < 1:
            raise CommandError("--max-question and --max-answer must be >= 1")
        if opts["celery"] and not jobs.broker_configured():
            raise CommandError("--celery needs a broker: set CELERY_BROKER_URL (e.g. redis://host:6379/0)")
        try:
            spec = SynthesisSpec(
                corpus=Path(opts["corpus"]).resolve(),
                dataset=Path(opts["dataset"]).resolve(),
                model=Path(resolve_model(opts["model"])).resolve(),
                conversations=opts["conversations"],
                first=opts["first"],
                shards=opts["shards"],
                held_out=opts["held_out"],
                seed=opts["seed"],
                batch=opts["batch"],
                selfstudy=SelfStudyConfig(max_question=opts["max_question"], max_answer=opts["max_answer"]),
            )
            check_spec(spec)  # before the model is loaded
        except (ValueError, ModelFileError) as exc:
            raise CommandError(str(exc)) from exc
        fanout = contextlib.nullcontext()
        if opts["celery"]:
            from fleet.services.celery_fanout import celery_map

            fanout = using(celery_map)
        progress = console.TqdmProgress(f"self-study {spec.dataset.name}")
        progress.bar.unit = "shard" if opts["celery"] else "conv"  # what the service counts (see its doc)
        try:
            with fanout:
                result = synthesize_dataset(spec, progress)
        except ValueError as exc:  # a dataset of other settings names its shard and field
            raise CommandError(str(exc)) from exc
        except (BuildCancelled, KeyboardInterrupt):
            # Tasks already running on workers go on writing their shards: a rerun before they end
            # would append to the same files alongside them.
            wait = "; let the workers' running shard tasks end first" if opts["celery"] else ""
            raise CommandError(
                f"interrupted: the conversations written are kept; rerun the same command to resume{wait}"
            ) from None
        finally:
            progress.close()
        self.stdout.write(json.dumps(result.as_dict()))
