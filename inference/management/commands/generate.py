"""``python manage.py generate [MODEL] --prompt TEXT``: one generation on the command line.

The generated text streams to stdout (only the text); the last stderr line is exactly
``prefill: N tokens, X tok/s; decode: M tokens, Y tok/s``, followed by ``; spec: A/D accepted``
with ``--spec`` (A of D drafted tokens accepted). With ``--cartridge F`` the prompt runs behind
the cartridge's KV prefix (its rows are not counted as prefill tokens).
"""

from __future__ import annotations

import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference.engine.chat_template import ChatTemplateError
from inference.engine.engine import Engine
from inference.engine.gguf_file import GGUFError
from inference.engine.jit.compile_watch import CompileWatch, compiles_kernels, warm_up_notice
from inference.engine.load_options import ExpertMode, LoadOptions
from inference.engine.sampler import SamplingParams
from inference.generation.capabilities import Capabilities, ServingFlags, refusal
from inference.generation.speculative import Speculator
from inference.generation.stream import GenerationStats
from inference.generation.tokens import TokenGenerator
from inference.kv.prefix_source import PrefixChoice, load_prefix_source
from inference.management.options import add_experts_argument
from inference.model_files import ModelFileError, resolve_model
from inference.types import Error, GenerationRequest, Message


class Command(BaseCommand):
    help = "Generate text from a prompt with a GGUF model (the default model when MODEL is omitted)."

    def add_arguments(self, parser):
        parser.add_argument("model", nargs="?", default="", help="GGUF path or model name (default: SmolLM2)")
        parser.add_argument("--prompt", required=True, help="the prompt text")
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--raw", action="store_true", help="use the prompt as is (default)")
        mode.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
        parser.add_argument("--max-tokens", type=int, default=128, help="tokens to generate (default 128)")
        parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default 0)")
        parser.add_argument("--seed", type=int, default=None, help="RNG seed for sampling")
        parser.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-generation")
        parser.add_argument("--ctx", type=int, default=4096, help="context length (default 4096)")
        parser.add_argument(
            "--spec",
            action="store_true",
            help="speculative decoding (the same text; verify costs are measured first)",
        )
        parser.add_argument(
            "--cartridge", default=None, metavar="FILE", help="run the prompt behind this cartridge"
        )
        add_experts_argument(parser)

    def handle(self, *args, **opts):
        if opts["max_tokens"] < 1:
            raise CommandError("--max-tokens must be at least 1")
        if opts["temperature"] < 0:
            raise CommandError("--temperature must be >= 0")
        try:
            options = LoadOptions(ExpertMode(opts["experts"]), opts["expert_cache"])
            engine = Engine.load(resolve_model(opts["model"]), options)
            text = opts["prompt"]
            if opts["chat"]:
                text = engine.render_chat([{"role": "user", "content": text}])
            prompt = engine.encode_prompt(text)
        except (ModelFileError, GGUFError, ChatTemplateError) as exc:
            raise CommandError(str(exc)) from exc
        flags = ServingFlags(spec=opts["spec"], prefix="--cartridge" if opts["cartridge"] else None)
        refused = refusal(engine.family, Capabilities.of_engine(engine), flags)
        if refused is not None:
            raise CommandError(refused)
        warm_up(engine)
        choice = cartridge_choice(engine, opts["cartridge"], text)
        rows = choice.prefix.rows if choice is not None else 0
        cache = engine.new_cache(rows + max(opts["ctx"], len(prompt) + 1))
        if choice is not None:
            cache.install_prefix(choice.prefix, choice.key)
        params = SamplingParams(temperature=opts["temperature"], seed=opts["seed"])
        speculator = Speculator(engine) if opts["spec"] else None

        def write(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        generator = TokenGenerator(engine, speculator)
        run = generator.run(
            cache, prompt, params, opts["max_tokens"], ignore_eos=opts["ignore_eos"], on_text=write
        )
        if isinstance(run.final, Error):
            raise CommandError(run.final.message)
        write("\n")
        stats = run.stats
        spec = f"; spec: {stats.spec_accepted}/{stats.spec_drafted} accepted" if speculator else ""
        sys.stderr.write(stats_line(stats) + spec + "\n")


def warm_up(engine: Engine) -> None:
    """Compile (or load) the kernels before the prompt, so the stats line's prefill rate is the
    prefill's own; on an empty numba cache, say so on stderr and report progress."""
    if compiles_kernels():
        sys.stderr.write(warm_up_notice() + "\n")
    with CompileWatch(lambda line: sys.stderr.write(f"{line}\n")):
        engine.warm_up()


def cartridge_choice(engine: Engine, path: str | None, text: str) -> PrefixChoice | None:
    """The prefix ``--cartridge`` names (the server's cartridge source), checked against the
    model; None without the flag."""
    if not path:
        return None
    try:
        source = load_prefix_source(settings.LMSERVE_PREFIX_SOURCES["cartridge"], path)
        source.check(engine)
    except (OSError, ValueError) as exc:  # CartridgeFormatError, PrefixMismatchError
        raise CommandError(str(exc)) from exc
    return source.choose(engine, GenerationRequest(messages=(Message("user", text),)))


def stats_line(stats: GenerationStats) -> str:
    """The summary line, with rates over each phase's own wall time."""

    def rate(n: int, seconds: float) -> float:
        return n / seconds if seconds > 0 else 0.0

    prefill_rate = rate(stats.prefilled_tokens, stats.prefill_seconds)
    decode_rate = rate(stats.decoded_tokens, stats.decode_seconds)
    return (
        f"prefill: {stats.prefilled_tokens} tokens, {prefill_rate:.1f} tok/s; "
        f"decode: {stats.generated_tokens} tokens, {decode_rate:.1f} tok/s"
    )
