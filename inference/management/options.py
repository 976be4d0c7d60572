"""Argument types and checks of the serving commands (``lmserve``, ``generate``): each turns a
bad value into a message naming the flag, as argparse or a ``CommandError``."""

from __future__ import annotations

import argparse
import math
from typing import NamedTuple

from django.conf import settings
from django.core.management.base import CommandError

from inference.types import SAMPLING_RANGES, SamplingOverrides


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def non_negative_margin(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a non-negative cosine margin, got {text!r}")
    return value


def port_number(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number: {value}")
    return value


def refuse_batch_with_fleet(batch: int, fleet: str | None) -> None:
    """``--batch`` above 1 with ``--fleet`` is a start-up error: a fleet picks documents per
    request and adopts slots by conversation identity, logic that serves one stream at a time."""
    if batch > 1 and fleet:
        raise CommandError(
            f"--batch {batch} cannot be combined with --fleet: per-request retrieval and sticky slot "
            "adoption serve one stream at a time; drop --batch (or use --batch 1) to serve a fleet"
        )


PREFIX_FLAGS = (("--fleet", "fleet"), ("--cartridge", "cartridge"), ("--prefix-source", "prefix_source"))


def refuse_unserved_flags(model_path, options: dict) -> None:
    """Every serving flag the model file's family cannot honour, refused by name before anything
    is loaded (what the family's layer code can do at most: a file whose weights turn out to have
    no fused forward is refused by the worker as it loads, naming --batch the same way)."""
    from inference.engine.families import family_of
    from inference.engine.gguf_file import GGUFError, GGUFFile
    from inference.generation.capabilities import Capabilities, ServingFlags, refusal

    try:
        family = family_of(GGUFFile(model_path))
    except GGUFError:
        return  # an unreadable or unsupported file: the worker reports it as it loads
    flags = ServingFlags(
        spec=bool(options.get("spec")),
        batch=options.get("batch") or 1,
        kv_cache_dir=bool(options.get("kv_cache_dir")),
        prefix=next((flag for flag, key in PREFIX_FLAGS if options.get(key)), None),
    )
    # The template's tool rendering has no flag to refuse; tools_rendered is not asked.
    most = Capabilities.of_family(family, tools_rendered=False, fused=family.model.may_fuse())
    refused = refusal(family, most, flags)
    if refused is not None:
        raise CommandError(refused)


def nanochat_directory(options: dict):
    """The --nanochat directory, checked now; every flag it cannot honour a CommandError."""
    from inference.engine.nanochat_checkpoint import NanochatCheckpointError, check_directory

    clashes = {
        "a MODEL argument": (options.get("model") is not None, "--nanochat DIR is the model"),
        "--spec": (options.get("spec"), "nanochat decodes without speculation"),
        "--batch > 1": ((options.get("batch") or 1) > 1, "nanochat serves one request at a time"),
        "--kv-slots > 1": ((options.get("kv_slots") or 1) > 1, "nanochat keeps no KV rows across requests"),
        "--kv-cache-dir": (options.get("kv_cache_dir"), "nanochat keeps no KV rows across requests"),
        "--cartridge": (options.get("cartridge"), "nanochat runs behind no KV prefix"),
        "--prefix-source": (options.get("prefix_source"), "nanochat runs behind no KV prefix"),
        "--fleet": (options.get("fleet"), "nanochat runs behind no KV prefix"),
    }
    given = [(flag, why) for flag, (value, why) in clashes.items() if value]
    if given:
        flags = ", ".join(flag for flag, _ in given)
        reasons = "; ".join(dict.fromkeys(why for _, why in given))
        raise CommandError(f"--nanochat excludes {flags}: {reasons}")
    try:
        return check_directory(options["nanochat"])
    except NanochatCheckpointError as exc:
        raise CommandError(str(exc)) from exc


WILDCARD_ADDRESSES = frozenset({"", "0.0.0.0", "::", "[::]"})


def add_experts_argument(parser) -> None:
    """``--experts {repack,borrow}`` (also ``--experts=borrow``), shared with ``generate``."""
    parser.add_argument(
        "--experts",
        choices=("repack", "borrow"),
        default="repack",
        help="a mixture-of-experts model's routed experts: 'repack' converts them all at load "
        "(fastest tokens, RAM for every expert); 'borrow' reads them in place from the mapped "
        "GGUF and converts only those a token's router picks (fast load, RAM for what is "
        "touched; the same replies). Nothing to borrow in a model without experts "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--expert-cache",
        type=positive_int,
        default=16,
        metavar="N",
        help="with --experts=borrow, the converted experts kept per expert tensor, least "
        "recently used dropped first: more is faster when routers revisit experts, at N "
        "converted experts' RAM per tensor (default: %(default)s)",
    )


def allowed_hosts(host: str, extra: str) -> list[str]:
    """The localhost names, the address the server binds (unless it is every interface's) and
    the ``--allowed-hosts`` names."""
    hosts = list(settings.LOCAL_HOSTS)
    if host not in WILDCARD_ADDRESSES:
        hosts.append(f"[{host}]" if ":" in host and not host.startswith("[") else host)
    hosts += [name.strip() for name in extra.split(",") if name.strip()]
    return list(dict.fromkeys(hosts))


class SamplingFlag(NamedTuple):
    """A server-wide sampling default: llama-server's flag name and the request field it sets."""

    flag: str
    field: str
    help: str


SAMPLING_FLAGS = (
    SamplingFlag("--temp", "temperature", "temperature, 0 to 2; 0 decodes greedily"),
    SamplingFlag("--top-k", "top_k", "keep the K most likely tokens; 0 keeps all"),
    SamplingFlag("--top-p", "top_p", "nucleus sampling, 0 to 1"),
    SamplingFlag("--min-p", "min_p", "drop tokens below this share of the best one's probability, 0 to 1"),
    SamplingFlag("--repeat-penalty", "repeat_penalty", "llama.cpp's repetition penalty, above 0 to 10"),
    SamplingFlag("--presence-penalty", "presence_penalty", "OpenAI's presence penalty, -2 to 2"),
    SamplingFlag("--frequency-penalty", "frequency_penalty", "OpenAI's frequency penalty, -2 to 2"),
    SamplingFlag("--seed", "seed", "seed of every request that sends none: sampled replies repeat"),
)


def sampling_value(name: str):
    """The argparse type of the sampling flag that sets ``name``: a number in its request range."""
    allowed = SAMPLING_RANGES[name]

    def parse(text: str) -> float | int:
        try:
            value = int(text) if allowed.integer else float(text)
        except ValueError:
            kind = "an integer" if allowed.integer else "a number"
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
        if not allowed.admits(value):
            raise argparse.ArgumentTypeError(f"expected {allowed.wording()}, got {text!r}")
        return value

    return parse


def add_sampling_arguments(parser) -> None:
    """The server-wide sampling defaults: what a request that leaves a field out gets instead
    of the model's recommended value (a request's own value still wins)."""
    group = parser.add_argument_group(
        "sampling defaults",
        "for requests that leave the field out (default: the GGUF's general.sampling.* values, "
        "else the family's recommended ones); a request's own value wins",
    )
    for option in SAMPLING_FLAGS:
        group.add_argument(
            option.flag,
            dest=f"sampling_{option.field}",
            type=sampling_value(option.field),
            default=None,
            metavar="N",
            help=option.help,
        )


def sampling_defaults(options: dict) -> SamplingOverrides:
    """The sampling defaults the flags set (every field None without them)."""
    return SamplingOverrides(
        **{option.field: options.get(f"sampling_{option.field}") for option in SAMPLING_FLAGS}
    )
