"""``python manage.py lmserve [MODEL.gguf] [flags]``: serve one model over HTTP (daphne)."""

from __future__ import annotations

import argparse
import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, DjangoHelpFormatter

from inference.engine.jit.numba_cache import use_keyed_cache_dir
from inference.kv.prefix_source import PrefixSource, load_prefix_source
from inference.management.options import (
    add_experts_argument,
    add_sampling_arguments,
    allowed_hosts,
    nanochat_directory,
    non_negative_margin,
    port_number,
    positive_int,
    positive_seconds,
    refuse_batch_with_fleet,
    refuse_unserved_flags,
    sampling_defaults,
)
from inference.model_files import ModelFileError, resolve_model
from inference.runtime.service import DEFAULT_MAX_BODY_BYTES, InferenceService, ServeConfig, install


def prepare_database(stdout) -> None:
    """Apply the migrations of the embedded SQLite database, so that the admin (and
    ``createsuperuser``) work on a fresh install. A configured server database (DATABASE_URL)
    is migrated by its operator, not behind their back."""
    from django.core.management import call_command
    from django.db import connection

    if connection.vendor != "sqlite":
        return
    try:
        call_command("migrate", interactive=False, verbosity=0, stdout=stdout)
    except Exception as exc:
        raise CommandError(f"cannot prepare the database {connection.settings_dict['NAME']}: {exc}") from exc


def prefix_source_from(options: dict) -> PrefixSource | None:
    """The KV prefix source the flags name (--cartridge, --prefix-source), read now so that a
    missing or malformed file stops the command before anything starts; None without one."""
    if options.get("cartridge"):
        factory, argument = settings.LMSERVE_PREFIX_SOURCES["cartridge"], options["cartridge"]
    elif options.get("prefix_source"):
        factory, _, argument = options["prefix_source"].partition(":")
    else:
        return None
    try:
        return load_prefix_source(factory, argument)
    except ImportError as exc:
        raise CommandError(f"cannot load the prefix source {factory!r}: {exc}") from exc
    except (OSError, ValueError) as exc:
        raise CommandError(str(exc)) from exc


SERVED = """\
Serve one GGUF model over HTTP (daphne) in three wire dialects, every /v1 path also without
the prefix:
  OpenAI Chat Completions   POST /v1/chat/completions   (OpenAI SDKs: base_url http://HOST:PORT/v1)
  OpenAI Responses          POST /v1/responses          (stateless: send the whole conversation)
  Anthropic Messages        POST /v1/messages, /v1/messages/count_tokens
                            (Anthropic SDKs, Claude Code: base URL http://HOST:PORT)
and around them: POST /v1/completions (legacy: a raw prompt, suffix FIM), llama.cpp's POST
/infill, /tokenize and /detokenize, POST /v1/embeddings, GET /v1/models, GET /health
(readiness, load; never needs the key), GET /metrics (Prometheus, see --metrics),
GET /openapi.json (OpenAPI 3.1), a chat page at / and the admin at /admin/. SIGINT/SIGTERM
drain in-flight work and exit 0."""

EPILOG = """\
environment: LMSERVE_MODEL, LMSERVE_MODELS_DIR, LMSERVE_API_KEY, LMSERVE_ALLOWED_HOSTS,
LMSERVE_DATA_DIR, LMSERVE_LOG_LEVEL. Deployment under systemd: docs/lmserve.service."""


class HelpFormatter(DjangoHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Django's option order, with the description's table kept as written."""


class Command(BaseCommand):
    help = SERVED

    def create_parser(self, prog_name, subcommand, **kwargs):
        parser = super().create_parser(prog_name, subcommand, formatter_class=HelpFormatter, **kwargs)
        parser.epilog = EPILOG
        return parser

    def add_arguments(self, parser):
        parser.add_argument(
            "model",
            nargs="?",
            default=None,
            help="GGUF file, or a model name in LMSERVE_MODELS_DIR (default: LMSERVE_MODEL, else the "
            "bundled SmolLM2-135M-Instruct)",
        )
        parser.add_argument(
            "--host", default="127.0.0.1", help="interface to listen on (default: %(default)s)"
        )
        parser.add_argument(
            "--port",
            type=port_number,
            default=8080,
            help="TCP port; 0 picks a free one and prints it (default: %(default)s)",
        )
        parser.add_argument(
            "--ctx",
            type=positive_int,
            default=ServeConfig.ctx,
            help="context length in tokens per KV slot, capped at the model's "
            "training context (default: %(default)s)",
        )
        parser.add_argument(
            "--allowed-hosts",
            default=os.environ.get("LMSERVE_ALLOWED_HOSTS", ""),
            help="comma-separated host names (or IPs) requests may carry in their Host header, on top "
            "of the localhost names and --host; '.example.com' matches subdomains, '*' any host. "
            "Other hosts get a 400, which keeps DNS-rebinding pages out (default: $LMSERVE_ALLOWED_HOSTS)",
        )
        parser.add_argument(
            "--api-key",
            default=os.environ.get("LMSERVE_API_KEY") or None,
            help="require this key (Authorization: Bearer or x-api-key) on every API endpoint of "
            "every dialect; /health, /openapi.json and the chat page never need it, nor /metrics "
            "unless its mode is key (default: $LMSERVE_API_KEY, else no key)",
        )
        parser.add_argument(
            "--queue",
            type=positive_int,
            default=ServeConfig.queue,
            help="requests that may wait for the worker; more get 429 (default: %(default)s)",
        )
        parser.add_argument(
            "--conns",
            type=positive_int,
            default=ServeConfig.conns,
            help="requests served at once (generating, queued or sending); more get 503 "
            "(default: %(default)s)",
        )
        parser.add_argument(
            "--kv-slots",
            type=positive_int,
            default=ServeConfig.kv_slots,
            help="resident KV caches kept for prefix reuse across requests; the start-up RAM guard "
            "clamps the count to fit half the available memory when all of it would not do "
            "(default: %(default)s)",
        )
        parser.add_argument(
            "--batch",
            type=positive_int,
            default=ServeConfig.batch,
            help="decode up to N already-queued requests together in lockstep (one pass over the "
            "weights per step for all of them); an idle server still answers a lone request at "
            "once, and requests arriving mid-batch wait for the next one. Raises --kv-slots to at "
            "least N (one cache per stream, priced by the RAM guard); not with --fleet, and refused "
            "for a model whose forward has no fused path (qwen3moe, gemma4, inkling, qwen35, "
            "diffusion-gemma): its batch would share no weight pass (default: %(default)s)",
        )
        parser.add_argument(
            "--kv-slots-force",
            action="store_true",
            help="keep --kv-slots even when the RAM guard would clamp it (it still warns)",
        )
        parser.add_argument(
            "--kv-cache-dir",
            default=None,
            help="disk tier: spill a KV slot about to be overwritten by an unrelated request to a "
            "sidecar file here and restore it, with no re-prefill, when a later request matches it "
            "best; files left by an earlier run are used again. Refused for a family that keeps no "
            "KV rows across requests (qwen35, inkling, diffusion-gemma) (default: no disk tier)",
        )
        parser.add_argument(
            "--kv-disk-slots",
            type=positive_int,
            default=ServeConfig.kv_disk_slots,
            help="sidecar files kept under --kv-cache-dir, least recently used reused first; a file "
            "being written counts under its temporary name, and temporaries a killed server left are "
            "removed at start-up (default: %(default)s)",
        )
        parser.add_argument(
            "--spec",
            action="store_true",
            help="speculative decoding: draft tokens from the conversation itself (a suffix automaton "
            "over prompt and reply) and from recycled verify logits, check several per forward; "
            "replies are exactly those of plain decoding (greedy and seeded), faster when the reply "
            "copies from the conversation; a gate from verify costs measured at start-up turns it "
            "off where it would lose time. Refused for a family whose state cannot be cut back to "
            "a token prefix (qwen35, inkling, diffusion-gemma)",
        )

        prefix = parser.add_mutually_exclusive_group()
        prefix.add_argument(
            "--cartridge",
            default=None,
            metavar="FILE",
            help="serve every conversation behind this cartridge (a trained KV prefix, built by "
            "build_cartridge): its rows take cache rows [0, p) and are never prompt tokens; refused "
            "at start-up when it was built for another model (default: none)",
        )
        prefix.add_argument(
            "--prefix-source",
            default=None,
            metavar="FACTORY:ARG",
            help="advanced: a PrefixSource of your own, as a dotted path to its factory and the "
            "one argument it is called with (default: none)",
        )

        parser.add_argument(
            "--stream-start-after",
            type=positive_seconds,
            default=ServeConfig.stream_start_after,
            help="open a streamed response (headers and the first event) once its request has "
            "waited this long for its first token in the queue or in prefill, so clients see "
            "progress; faster failures stay plain JSON errors (default: %(default)s)",
        )
        parser.add_argument(
            "--keepalive",
            type=positive_seconds,
            default=ServeConfig.keepalive_every,
            help="seconds between keep-alives (Anthropic ping events, SSE comments) on an open "
            "stream that has nothing else to send (default: %(default)s)",
        )

        parser.add_argument(
            "--metrics",
            choices=("open", "key", "off"),
            default=ServeConfig.metrics,
            help="GET /metrics (Prometheus text format): 'open' needs no key, like /health (counts "
            "and timings only, never text); 'key' needs --api-key; 'off' answers 404 "
            "(default: %(default)s)",
        )
        add_experts_argument(parser)
        add_sampling_arguments(parser)
        self.add_fleet_arguments(parser)
        parser.add_argument(
            "--nanochat",
            default=None,
            metavar="DIR",
            help="serve a nanochat checkpoint instead of a GGUF: DIR holds model.safetensors and "
            "tokenizer.bin (the reference port's formats). Its own engine and chat protocol: no "
            "system role, its built-in calculator tool, no grammar, one request at a time on a "
            "fresh cache. Excludes MODEL and the KV, batch and speculation flags (default: none)",
        )

    def handle(self, *args, **options):
        refuse_batch_with_fleet(options["batch"], options.get("fleet"))
        settings.ALLOWED_HOSTS = allowed_hosts(options["host"], options["allowed_hosts"])
        if options["nanochat"]:
            return self.serve(options, nanochat_directory(options), prefix_source=None)
        model = options["model"] if options["model"] is not None else settings.LMSERVE_MODEL
        try:
            model_path = resolve_model(model or "")
        except ModelFileError as exc:
            raise CommandError(str(exc)) from exc
        # Refusals before anything else: the flags the model's family cannot honour, a fleet's
        # flags, then a cartridge file that cannot be read.
        refuse_unserved_flags(model_path, options)
        prefix_source = self.fleet_source(options, model_path) or prefix_source_from(options)
        options["model"] = model
        self.serve(options, model_path, prefix_source)

    def serve(self, options: dict, model_path, prefix_source: PrefixSource | None) -> None:
        """Serve ``model_path`` (a GGUF, or the --nanochat directory) until stopped."""
        prepare_database(self.stdout)
        use_keyed_cache_dir(prune=True)  # the server's start removes kernels of old engine versions
        config = ServeConfig(
            model=options["model"] or "",
            ctx=options["ctx"],
            api_key=options["api_key"],
            queue=options["queue"],
            conns=options["conns"],
            kv_slots=options["kv_slots"],
            batch=options["batch"],
            kv_slots_force=options["kv_slots_force"],
            kv_cache_dir=options["kv_cache_dir"],
            kv_disk_slots=options["kv_disk_slots"],
            max_body_bytes=getattr(settings, "LMSERVE_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES),
            stream_start_after=options["stream_start_after"],
            keepalive_every=options["keepalive"],
            metrics=options["metrics"],
            spec=options["spec"],
            sampling=sampling_defaults(options),
            experts=options["experts"],
            expert_cache=options["expert_cache"],
            nanochat=str(model_path) if options["nanochat"] else None,
        )
        service = InferenceService(config, model_path, prefix_source=prefix_source)
        install(service)

        from api.server import serve
        from lmserve_site.asgi import application

        status = serve(application, service, options["host"], options["port"])
        if status != 0:
            raise CommandError("the server stopped with an error", returncode=status)

    # -- fleets (issue 18): --fleet and the retrieval knobs --------------------------------
    def add_fleet_arguments(self, parser) -> None:
        parser.add_argument(
            "--fleet",
            default=None,
            metavar="DIR",
            help="serve a fleet (manage.py build_fleet): each conversation's user messages pick "
            "--rag-docs documents through the model's own embeddings and their cartridges compose "
            "as its KV prefix; a conversation (known by its first user message) keeps its documents. "
            "Excludes --cartridge, --kv-cache-dir and --batch > 1 (default: no fleet)",
        )
        parser.add_argument(
            "--rag-docs",
            type=positive_int,
            default=2,
            help="fleet: documents composed per conversation (default: %(default)s)",
        )
        parser.add_argument(
            "--rag-chunks",
            type=positive_int,
            default=8,
            help="fleet: the top chunks by cosine that documents are picked from (default: %(default)s)",
        )
        parser.add_argument(
            "--rag-adaptive",
            action="store_true",
            help="fleet: every follow-up re-embeds all the user messages and switches documents when "
            "one outside the selection beats every selected document's best chunk by --rag-margin",
        )
        parser.add_argument(
            "--rag-margin",
            type=non_negative_margin,
            default=0.05,
            help="fleet: the --rag-adaptive switch margin, in cosine units (default: %(default)s)",
        )

    def fleet_source(self, options: dict, model_path):
        """The fleet's PrefixSource, or None without --fleet; every refusal a CommandError
        before anything is served."""
        directory = options.get("fleet")
        if not directory:
            return None
        reasons = {
            "--cartridge": (options.get("cartridge"), "a fleet picks each conversation's cartridges itself"),
            "--kv-cache-dir": (
                options.get("kv_cache_dir"),
                "KV sidecars do not record the documents a slot ran behind",
            ),
            "--batch > 1": ((options.get("batch") or 1) > 1, "retrieval with sticky slots is single-stream"),
        }
        clashes = [(flag, why) for flag, (given, why) in reasons.items() if given]
        if clashes:
            raise CommandError(
                f"--fleet excludes {', '.join(flag for flag, _ in clashes)}: "
                + "; ".join(why for _, why in clashes)
            )
        from django.utils.module_loading import import_string

        try:  # the fleet app's source, named in settings: inference never imports fleet
            source = import_string(settings.LMSERVE_PREFIX_SOURCES["fleet"])(
                directory,
                rag_docs=options["rag_docs"],
                rag_chunks=options["rag_chunks"],
                adaptive=options["rag_adaptive"],
                margin=options["rag_margin"],
            )
            source.check_model_file(model_path)
        except (OSError, ValueError) as exc:  # FleetFormatError, PrefixMismatchError
            raise CommandError(str(exc)) from exc
        rows = source.composed_rows_max()
        if rows >= options["ctx"]:
            raise CommandError(
                f"--ctx {options['ctx']} leaves no room for the conversation behind up to {rows} "
                f"prefix rows (--rag-docs {options['rag_docs']} cartridges of this fleet)"
            )
        return source
