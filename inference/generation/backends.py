"""The backend seam: which generation loop serves a loaded model, chosen in one place.

Every backend keeps the same two-sided contract (see :class:`GenerationBackend`): ``validate``
on the connection side, ``generate`` on the worker thread. The generic
:class:`~inference.generation.backend.ConversationBackend` serves every family we have; a
family that needs its own loop (recurrent state that cannot reuse a slot's token prefix,
block diffusion that streams one delta per committed block) names it in its
``Family.backend`` and adds one entry to :data:`BACKENDS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from inference.engine.engine import Engine
from inference.engine.nanochat_checkpoint import NanochatCheckpoint
from inference.generation.backend import ConversationBackend, Sink
from inference.generation.diffusion import DiffusionBackend
from inference.kv.disk import SidecarStore
from inference.kv.prefix_source import PrefixSource
from inference.kv.slots import SlotPool
from inference.types import Error, GenerationRequest, PreparedPrompt


class GenerationBackend(Protocol):
    """What the runtime needs from a backend. A backend may also offer
    ``generate_batch(items: Sequence[BatchItem]) -> list[int]`` (lockstep decoding of several
    requests, ``--batch``); the worker serves a batch one request after another on a backend
    without it."""

    engine: Engine
    n_ctx: int
    slots: SlotPool | None  # the warm KV slots, for backends that reuse rows across requests

    @property
    def supports_reasoning(self) -> bool: ...

    @property
    def supports_tools(self) -> bool: ...

    @property
    def kv_reuse(self) -> bool: ...

    def tokenize(self, request: GenerationRequest) -> list[int] | Error: ...

    def validate(self, request: GenerationRequest) -> PreparedPrompt | Error: ...

    def generate(self, request: GenerationRequest, prompt: PreparedPrompt, sink: Sink) -> int: ...

    def warm_up(self) -> None: ...

    def release(self) -> None: ...


@dataclass(frozen=True)
class BackendSetup:
    """What the worker hands a backend factory once the model is loaded."""

    engine: Engine | None  # None for a nanochat checkpoint (which has its own engine)
    n_ctx: int
    kv_slots: int = 1
    disk: SidecarStore | None = None
    prefix_source: PrefixSource | None = None  # the KV prefix of every conversation, if any
    spec: bool = False  # speculative decoding (--spec)
    nanochat: NanochatCheckpoint | None = None  # lmserve --nanochat DIR: served by "nanochat"


def _conversation(setup: BackendSetup) -> GenerationBackend:
    family = setup.engine.family
    if not family.kv_reuse:
        _refuse_kept_rows(setup, family.architecture)
    # --spec on a family whose forward cannot verify and cut back (inkling) decodes plainly.
    spec = setup.spec and family.spec
    return ConversationBackend(
        setup.engine, setup.n_ctx, setup.kv_slots, setup.disk, setup.prefix_source, spec=spec
    )


def _refuse_kept_rows(setup: BackendSetup, architecture: str) -> None:
    """A family that starts every request clean cannot use a disk tier or a KV prefix:
    refused at start-up, naming the flags, rather than failing or wasting work per request."""
    refused = [
        flag
        for flag, on in (
            ("--kv-cache-dir", setup.disk is not None),
            ("--cartridge / --fleet", setup.prefix_source is not None),
        )
        if on
    ]
    if refused:
        raise ValueError(
            f"{architecture} keeps no KV rows across requests (its state cannot be cut back to a "
            f"token prefix): {' and '.join(refused)} cannot serve it"
        )


def _nanochat(setup: BackendSetup) -> GenerationBackend:
    from inference.generation.nanochat import NanochatBackend

    return NanochatBackend(setup.nanochat, setup.n_ctx)


def _diffusion(setup: BackendSetup) -> GenerationBackend:
    if setup.prefix_source is not None:  # refused at start-up rather than ignored per request
        raise ValueError("a diffusion model cannot run behind a KV prefix (--cartridge, --fleet)")
    return DiffusionBackend(setup.engine, setup.n_ctx)


def _recurrent(setup: BackendSetup) -> GenerationBackend:
    from inference.generation.recurrent import RecurrentBackend

    refused = [
        flag for flag, on in (("--kv-cache-dir", setup.disk is not None), ("--spec", setup.spec)) if on
    ]
    if refused:
        raise ValueError(
            f"{setup.engine.family.architecture} keeps recurrent state that cannot be cut back to a "
            f"token prefix: {' and '.join(refused)} cannot serve it"
        )
    return RecurrentBackend(setup.engine, setup.n_ctx, setup.prefix_source)


BACKENDS: dict[str, Callable[[BackendSetup], GenerationBackend]] = {
    "conversation": _conversation,
    "nanochat": _nanochat,  # not a GGUF family: chosen by BackendSetup.nanochat
    "diffusion": _diffusion,
    "recurrent": _recurrent,  # qwen35 / qwen35moe: a fresh cache per request (recurrent.py)
}


def backend_for(setup: BackendSetup) -> GenerationBackend:
    """The backend the loaded model's family names (a nanochat checkpoint's own)."""
    if setup.nanochat is not None:
        return BACKENDS["nanochat"](setup)
    family = setup.engine.family
    factory = BACKENDS.get(family.backend)
    if factory is None:
        known = ", ".join(sorted(BACKENDS))
        raise ValueError(
            f"family {family.architecture!r} names generation backend {family.backend!r}, "
            f"which does not exist (known: {known})"
        )
    return factory(setup)
