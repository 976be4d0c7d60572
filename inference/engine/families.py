"""What each model family is, stated once: its layer code and what serving it needs to know.

A :class:`Family` is keyed by GGUF ``general.architecture``. The engine reads the model class,
the template fallback, the recommended sampling and the extra stop tokens; the serving layer
(``inference.generation``) reads the think tags, the tool-call convention and the family's
:class:`StateKind`, from which follow whether a request may reuse KV rows of an earlier one,
which generation backend serves the family and which serving flags it honours. A new
family is one entry in :data:`FAMILIES` (plus its layer code under ``models/``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .gguf_file import GGUFError, GGUFFile
from .models import DecoderModel
from .models.diffusion_gemma import DiffusionGemmaModel
from .models.gemma3 import Gemma3Model
from .models.gemma4 import Gemma4Model
from .models.inkling import InklingModel
from .models.llama import LlamaModel
from .models.qwen2 import Qwen2Model
from .models.qwen3 import Qwen3Model
from .models.qwen3moe import Qwen3MoeModel
from .models.qwen35 import Qwen35Model
from .models.qwen35moe import Qwen35MoeModel
from .sampler import SamplingParams


@dataclass(frozen=True)
class ThinkTags:
    """The markers around the reasoning block a family's replies may open with.

    ``special``: texts of control tokens the markers are made of. Control tokens render as
    nothing in reply text; these are rendered as their text while the reply may still open or
    close its think block, so the emitter can see the markers (Gemma 4's channel tokens)."""

    open: str
    close: str
    special: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolConvention:
    """How a family writes a function call: a JSON object ``{"name", "arguments"}`` between
    ``open`` and ``close`` (``name`` says which convention, for logs and docs)."""

    name: str
    open: str
    close: str


# llama.cpp's defaults: what a family gets when neither it nor the GGUF recommends anything.
LLAMA_CPP_SAMPLING = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
QWEN3_SAMPLING = SamplingParams(temperature=0.7, top_k=20, top_p=0.8)
# Qwen3.5's model card, thinking mode (the GGUF's general.sampling.* keys win when present).
QWEN35_SAMPLING = SamplingParams(temperature=1.0, top_k=20, top_p=0.95, min_p=0.0)
QWEN_THINK = ThinkTags("<think>", "</think>")
# The reference serves Inkling with these (backend_inkling.zig: coherent without client overrides).
INKLING_SAMPLING = SamplingParams(temperature=0.7, top_p=0.9)
# Inkling's reply opens a thinking block and then a text block (typed blocks, docs/FAMILIES.md).
INKLING_THINK = ThinkTags("<|content_thinking|>", "<|content_text|>")
# Gemma 4 writes its reasoning in a thought channel: <|channel>thought\n...<channel|>answer.
GEMMA4_THINK = ThinkTags("<|channel>thought\n", "<channel|>", special=("<|channel>", "<channel|>"))
HERMES_TOOLS = ToolConvention("hermes", "<tool_call>", "</tool_call>")


class StateKind(Enum):
    """What a conversation's cached state is: the one fact a family's serving flags follow from.

    ``KV``: attention K/V rows only, which can be cut back to any token prefix: a request may
    start from an earlier one's rows, a verify run's rejected tail is dropped (speculation),
    and several conversations' caches can share one forward (a lockstep batch).
    ``ROLLING``: K/V rows plus inputs that only roll forward (inkling's short convolutions):
    nothing can be cut back, but several caches can still share a forward.
    ``RECURRENT``: a DeltaNet hybrid's conv inputs and state matrices (qwen35): a fresh cache
    per request on its own backend, one request at a time.
    ``DIFFUSION``: a block-diffusion model's canvases (diffusion-gemma): its own backend, no
    token-by-token decoding, so no grammar either."""

    KV = "kv"
    ROLLING = "rolling"
    RECURRENT = "recurrent"
    DIFFUSION = "diffusion"

    @property
    def kv_reuse(self) -> bool:
        """Whether a request may start from the cached rows of an earlier one."""
        return self is StateKind.KV

    @property
    def spec(self) -> bool:
        """Whether a verify run can be cut back to its accepted tokens (speculative decoding)."""
        return self is StateKind.KV

    @property
    def lockstep(self) -> bool:
        """Whether the backend decodes several conversations per forward call."""
        return self in (StateKind.KV, StateKind.ROLLING)

    @property
    def grammar(self) -> bool:
        """Whether decoding draws token by token, so a grammar can mask each draw."""
        return self is not StateKind.DIFFUSION

    @property
    def backend(self) -> str:
        """The generation loop (a key of ``inference.generation.backends.BACKENDS``)."""
        return _BACKENDS.get(self, "conversation")

    @property
    def why(self) -> str:
        """What this state allows of cutting back, as a refusal of a flag that needs it says."""
        return _WHY[self]


_BACKENDS = {StateKind.RECURRENT: "recurrent", StateKind.DIFFUSION: "diffusion"}
_WHY = {
    StateKind.KV: "its KV rows can be cut back to any token prefix",
    StateKind.ROLLING: "its short-convolution inputs only roll forward, never back to a token prefix",
    StateKind.RECURRENT: "its recurrent state cannot be cut back to a token prefix",
    StateKind.DIFFUSION: "it denoises whole canvases on a fresh cache per request",
}


@dataclass(frozen=True)
class Family:
    """One model family's facts.

    ``template_fallback`` names the chat template used when the GGUF carries none (a key of
    ``chat_template.FALLBACKS``); ``sampling`` is what the family recommends when the GGUF has
    no ``general.sampling.*`` keys; ``stop_tokens`` are token texts that end a reply on top of
    the vocabulary's own end-of-generation ids; ``state`` is what a conversation's cache holds
    (:class:`StateKind`), from which KV reuse, speculation, lockstep batches, grammar and the
    backend follow; ``think_prefilled``: the generation prompt already opens the think block
    (Qwen3.5/3.6), so the reply starts inside it and the backend feeds the opener to the
    reply's think router."""

    architecture: str
    model: type[DecoderModel]
    template_fallback: str = "chatml"
    sampling: SamplingParams = LLAMA_CPP_SAMPLING
    think: ThinkTags | None = None
    tools: ToolConvention | None = None
    stop_tokens: tuple[str, ...] = ()
    state: StateKind = StateKind.KV
    think_prefilled: bool = False

    @property
    def kv_reuse(self) -> bool:
        return self.state.kv_reuse

    @property
    def spec(self) -> bool:
        return self.state.spec

    @property
    def grammar(self) -> bool:
        return self.state.grammar

    @property
    def backend(self) -> str:
        return self.state.backend

    @property
    def batch(self) -> bool:
        """Whether a lockstep batch can share one weight pass: the backend decodes several
        conversations per forward and the layer code has a fused forward (a loaded file's
        weights may still lack its kernels: ``DecoderModel.fused``)."""
        return self.state.lockstep and self.model.may_fuse()


# Qwen3.5's facts beside its layer code: its DeltaNet state, and a template that prefills the
# think opener.
RECURRENT_QWEN35 = dict(
    sampling=QWEN35_SAMPLING,
    think=QWEN_THINK,
    tools=HERMES_TOOLS,
    think_prefilled=True,
    state=StateKind.RECURRENT,
)

FAMILIES: dict[str, Family] = {
    family.architecture: family
    for family in (
        Family("llama", LlamaModel),
        Family("qwen2", Qwen2Model, tools=HERMES_TOOLS),
        Family("qwen3", Qwen3Model, sampling=QWEN3_SAMPLING, think=QWEN_THINK, tools=HERMES_TOOLS),
        Family("qwen3moe", Qwen3MoeModel, sampling=QWEN3_SAMPLING, think=QWEN_THINK, tools=HERMES_TOOLS),
        Family("gemma3", Gemma3Model, template_fallback="gemma"),
        Family("qwen35", Qwen35Model, **RECURRENT_QWEN35),
        Family("qwen35moe", Qwen35MoeModel, **RECURRENT_QWEN35),
        Family(
            "gemma4",
            Gemma4Model,
            template_fallback="gemma4",
            think=GEMMA4_THINK,
            stop_tokens=("<turn|>", "<eos>"),
        ),
        Family(
            "inkling",
            InklingModel,
            template_fallback="inkling",
            sampling=INKLING_SAMPLING,
            think=INKLING_THINK,
            stop_tokens=("<|content_model_end_sampling|>",),
            state=StateKind.ROLLING,
        ),
        Family(
            "diffusion-gemma",
            DiffusionGemmaModel,
            template_fallback="gemma4",
            stop_tokens=("<turn|>", "<eos>", "<|tool_response>"),
            state=StateKind.DIFFUSION,
        ),
    )
}


def family_of(f: GGUFFile) -> Family:
    """The family named by the file's ``general.architecture``; GGUFError if we serve none."""
    family = FAMILIES.get(f.architecture)
    if family is None:
        supported = ", ".join(sorted(FAMILIES))
        raise GGUFError(
            f"{f.path}: architecture {f.architecture!r} is not supported (supported: {supported})"
        )
    return family
