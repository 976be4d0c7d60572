"""The backend seam: which generation loop serves a loaded model, chosen in one place.

Every backend keeps the same two-sided contract (see :class:`GenerationBackend`): ``validate``
on the connection side, ``generate`` on the worker thread, and says what it does in its
``capabilities``. The generic :class:`~inference.generation.backend.ConversationBackend`
serves most families; one whose state needs something else (recurrent state that cannot reuse
a slot's token prefix: the same loop over fresh caches; block diffusion that streams one delta
per committed block: a loop of its own) names it through its ``StateKind``
(``Family.backend``), one entry of :data:`BACKENDS`. Flags the loaded model cannot honour are
refused here, by name, before any backend is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from inference.engine.engine import Engine
from inference.engine.nanochat_checkpoint import NanochatCheckpoint
from inference.generation.backend import ConversationBackend, Sink
from inference.generation.capabilities import Capabilities, ServingFlags, refusal
from inference.generation.diffusion import DiffusionBackend
from inference.kv.disk import SidecarStore
from inference.kv.prefix_source import PrefixSource
from inference.kv.slots import SlotPool
from inference.types import Error, GenerationRequest, PreparedPrompt


class GenerationBackend(Protocol):
    """What the runtime needs from a backend. ``capabilities`` says what it really does (what
    ``/health`` reports, and what the worker and the service branch on); a backend whose
    ``capabilities.batch`` holds also offers ``generate_batch(items: Sequence[BatchItem],
    joins: Joins | None) -> list[int]`` (lockstep decoding of several requests, ``--batch``,
    that later requests join)."""

    engine: Engine | None  # None for a backend with its own engine (nanochat)
    n_ctx: int
    slots: SlotPool | None  # the warm KV slots, for backends that reuse rows across requests
    capabilities: Capabilities

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
    batch: int = 1  # generations decoded together in lockstep (--batch)
    nanochat: NanochatCheckpoint | None = None  # lmserve --nanochat DIR: served by "nanochat"


def refuse_unserved_flags(setup: BackendSetup) -> None:
    """A flag the loaded model cannot honour fails the start-up, named (the ``lmserve``
    command refuses the family's flags before loading; this catches the rest, such as a file
    whose weights have no fused forward, and every other way of starting a worker)."""
    flags = ServingFlags(
        spec=setup.spec,
        batch=setup.batch,
        kv_cache_dir=setup.disk is not None,
        prefix="--cartridge / --fleet" if setup.prefix_source is not None else None,
    )
    refused = refusal(setup.engine.family, Capabilities.of_engine(setup.engine), flags)
    if refused is not None:
        raise ValueError(refused)


def _conversation(setup: BackendSetup) -> GenerationBackend:
    return ConversationBackend(
        setup.engine, setup.n_ctx, setup.kv_slots, setup.disk, setup.prefix_source, spec=setup.spec
    )


def _nanochat(setup: BackendSetup) -> GenerationBackend:
    from inference.generation.nanochat import NanochatBackend

    return NanochatBackend(setup.nanochat, setup.n_ctx)


def _diffusion(setup: BackendSetup) -> GenerationBackend:
    return DiffusionBackend(setup.engine, setup.n_ctx)


def _recurrent(setup: BackendSetup) -> GenerationBackend:
    from inference.generation.recurrent import recurrent_backend

    return recurrent_backend(setup.engine, setup.n_ctx)


BACKENDS: dict[str, Callable[[BackendSetup], GenerationBackend]] = {
    "conversation": _conversation,
    "nanochat": _nanochat,  # not a GGUF family: chosen by BackendSetup.nanochat
    "diffusion": _diffusion,
    "recurrent": _recurrent,  # qwen35 / qwen35moe: the conversation loop over fresh caches (recurrent.py)
}


def backend_for(setup: BackendSetup) -> GenerationBackend:
    """The backend the loaded model's family names (a nanochat checkpoint's own); ValueError
    naming every flag of ``setup`` the model cannot honour."""
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
    refuse_unserved_flags(setup)
    return factory(setup)
