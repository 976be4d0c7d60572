"""What a loaded backend really does, said once: reported by ``/health`` and ``/v1/models``,
asked by the worker and the service, and checked against the serving flags at start-up.

Every backend carries a :class:`Capabilities`; a GGUF family's are derived from its
``Family`` (its :class:`~inference.engine.families.StateKind` above all) and from the loaded
file (whether its chat template renders tool declarations, whether its weights run the fused
forward). A flag the backend cannot honour is refused by name (:func:`refusal`), never
accepted and silently unused.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from inference.engine.families import Family

if TYPE_CHECKING:
    from inference.engine.engine import Engine


@dataclass(frozen=True)
class Capabilities:
    """What a loaded model's backend does.

    ``tools``: function calls are captured in the family's convention (and the template renders
    the declarations); ``reasoning``: think blocks are routed apart from the reply; ``grammar``:
    ``response_format`` and forced tool calls constrain decoding; ``kv_reuse``: a request may
    start from an earlier one's cached KV rows, which is also what a disk tier
    (``--kv-cache-dir``) and a KV prefix (``--cartridge``, ``--fleet``) need; ``batch``: a
    lockstep batch (``--batch N``) decodes several conversations in one pass over the weights
    per step; ``spec``: speculative decoding (``--spec``) can verify drafts and cut a run back;
    ``embeddings``: ``/v1/embeddings`` is served."""

    tools: bool
    reasoning: bool
    grammar: bool
    kv_reuse: bool
    batch: bool
    spec: bool
    embeddings: bool

    @classmethod
    def of_family(cls, family: Family, tools_rendered: bool, fused: bool) -> Capabilities:
        """A GGUF family's, for a file whose template does (or does not) render tool
        declarations and whose weights do (or do not) run the fused forward (a lockstep batch
        through the numpy layers would read the weights once per conversation)."""
        return cls(
            tools=family.tools is not None and tools_rendered,
            reasoning=family.think is not None,
            grammar=family.grammar,
            kv_reuse=family.kv_reuse,
            batch=family.state.lockstep and fused,
            spec=family.spec,
            embeddings=True,
        )

    @classmethod
    def of_engine(cls, engine: Engine) -> Capabilities:
        """A loaded GGUF model's: its family's, its template's and its weights' (whether they
        run the fused forward)."""
        fused = engine.model.fused is not None
        return cls.of_family(engine.family, engine.chat_template.supports_tools, fused)


CAPABILITY_NAMES = tuple(field.name for field in fields(Capabilities))


@dataclass(frozen=True)
class ServingFlags:
    """The serving flags a backend may not be able to honour. ``prefix``: the flag that names
    the KV prefix every conversation runs behind (``--cartridge``, ``--fleet``,
    ``--prefix-source``), or None."""

    spec: bool = False
    batch: int = 1
    kv_cache_dir: bool = False
    prefix: str | None = None


def refusal(family: Family, capabilities: Capabilities, flags: ServingFlags) -> str | None:
    """Why the flags cannot serve this family, each refused flag named with its reason; None
    when every flag given is honoured."""
    name = f"the {family.architecture} family"
    if not family.state.lockstep:
        no_batch = "its backend serves one request at a time"
    else:
        no_batch = (
            "its forward runs the numpy layers one conversation after another (no fused forward), "
            "so a batch would share no pass over the weights"
        )
    reasons = [
        (flags.spec and not capabilities.spec, "--spec", f"{family.state.why}, so no draft can be verified"),
        (flags.batch > 1 and not capabilities.batch, f"--batch {flags.batch}", no_batch),
        (
            flags.kv_cache_dir and not capabilities.kv_reuse,
            "--kv-cache-dir",
            f"{family.state.why}, so it keeps no KV rows across requests",
        ),
        (
            flags.prefix is not None and not capabilities.kv_reuse,
            flags.prefix,
            f"{family.state.why}, so it cannot run behind a KV prefix",
        ),
    ]
    refused = [f"{flag} is not supported for {name}: {why}" for given, flag, why in reasons if given]
    return "; ".join(refused) or None
