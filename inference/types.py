"""The one dialect-free request the worker serves, and the events it streams back.

Every wire dialect (Chat Completions, Responses, Anthropic Messages) parses its own JSON into
a :class:`GenerationRequest` and encodes the :data:`Event` stream in its own shape. Nothing
here knows about HTTP or a dialect's JSON shapes (tool arguments and schemas are carried as JSON
text).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Literal, NamedTuple, Protocol

import numpy as np

from inference.engine.sampler import SamplingParams

Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "tool_calls"]
ConstraintKind = Literal["json_schema", "regex", "lark", "tool_call"]
PERMISSIVE_ARGUMENTS = {"type": "object"}  # a tool declared without parameters takes any object


@dataclass(frozen=True)
class ConstraintSpec:
    """What a reply must match. ``source`` is the schema as JSON text, the regex, the Lark
    grammar, or (``tool_call``) the forced call's tools as JSON text, which becomes a grammar
    once the family's call convention is known (``toolcall.resolve_forced_call``); ``param``
    is the request field it came from (named in errors)."""

    kind: ConstraintKind
    source: str
    param: str

    @classmethod
    def json_schema(cls, schema: dict, param: str) -> ConstraintSpec:
        return cls("json_schema", json.dumps(schema), param)


@dataclass(frozen=True)
class ToolSpec:
    """One declared function: its JSON-schema ``parameters`` and whether they are enforced."""

    name: str
    description: str = ""
    parameters: dict | None = None
    strict: bool = False

    def template_dict(self) -> dict:
        """The OpenAI tool shape chat templates iterate over."""
        function = {"name": self.name, "description": self.description}
        function["parameters"] = self.parameters if self.parameters is not None else PERMISSIVE_ARGUMENTS
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolCall:
    """A completed call; ``arguments`` is the arguments object as compact JSON text."""

    name: str
    arguments: str

    def template_dict(self) -> dict:
        """The OpenAI shape chat templates read, arguments as an object (templates tojson it)."""
        return {"type": "function", "function": {"name": self.name, "arguments": json.loads(self.arguments)}}


@dataclass(frozen=True)
class Message:
    """One turn of the conversation, content already flattened to text."""

    role: Role
    content: str
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant turn's calls (their ids stay with the client)

    def as_template_dict(self) -> dict:
        """The shape GGUF chat templates expect (they index ``message['role']`` etc.)."""
        out: dict = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [call.template_dict() for call in self.tool_calls]
        return out


class SamplingRange(NamedTuple):
    """The values a sampling field takes, wherever it is set (a request, an ``lmserve`` flag)."""

    lowest: float | None
    highest: float | None = None
    lowest_excluded: bool = False
    integer: bool = False

    def admits(self, value: int | float) -> bool:
        """Whether ``value`` lies in the range. An int is compared exactly: JSON integers are
        unbounded and ``math.isfinite`` overflows past 1e308."""
        finite = isinstance(value, int) or math.isfinite(value)
        if self.lowest is None:
            low_ok = True
        else:
            low_ok = value > self.lowest if self.lowest_excluded else value >= self.lowest
        high_ok = self.highest is None or value <= self.highest
        return finite and low_ok and high_ok

    def wording(self) -> str:
        """The range in words, for an error message: "from 0.0 to 2.0", "above 0.0 to 10.0"."""
        low = "" if self.lowest is None else f"{'above' if self.lowest_excluded else 'from'} {self.lowest}"
        high = "" if self.highest is None else f" to {self.highest}"
        return (low + high).strip() or "any value"


# OpenAI's ranges, llama.cpp's for its extensions (min_p, repeat_penalty, top_k).
SAMPLING_RANGES = {
    "temperature": SamplingRange(0.0, 2.0),
    "top_p": SamplingRange(0.0, 1.0),
    "top_k": SamplingRange(0, integer=True),
    "min_p": SamplingRange(0.0, 1.0),
    "repeat_penalty": SamplingRange(0.0, 10.0, lowest_excluded=True),
    "presence_penalty": SamplingRange(-2.0, 2.0),
    "frequency_penalty": SamplingRange(-2.0, 2.0),
    "seed": SamplingRange(None, integer=True),
}


@dataclass(frozen=True)
class SamplingOverrides:
    """The sampling fields a request set; ``None`` means "the model's recommended value"."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None

    def over(self, server: SamplingOverrides) -> SamplingOverrides:
        """The fields this request set, and the server's (``lmserve --temp`` ...) where it set none."""
        return replace(server, **{name: value for name, value in self.__dict__.items() if value is not None})

    @property
    def is_empty(self) -> bool:
        return all(value is None for value in self.__dict__.values())

    def resolve(self, defaults: SamplingParams) -> SamplingParams:
        """``defaults`` with every field this request set replaced."""
        chosen = {name: value for name, value in self.__dict__.items() if value is not None}
        if "seed" in chosen:
            # numpy's generators take non-negative seeds; OpenAI's seed is any int64.
            chosen["seed"] = chosen["seed"] % (1 << 64)
        return replace(defaults, **chosen)


@dataclass(frozen=True)
class LogprobsRequest:
    """Log probabilities were asked for: each reported token with its ``top`` most likely
    alternatives (0..20). ``param`` is the field the dialect asks with (Chat Completions:
    ``logprobs``; Responses: ``top_logprobs``), for a backend that must refuse them."""

    top: int = 0
    param: str = "logprobs"


@dataclass(frozen=True)
class FileContext:
    """A file of the repository a fill-in-the-middle request edits, given as extra context."""

    filename: str
    text: str


@dataclass(frozen=True)
class FillInMiddle:
    """Fill in the middle: the model writes what goes between the raw prompt (the text before
    the gap) and ``suffix``, in the FIM tokens of its vocabulary (``<|fim_prefix|>`` ...)."""

    suffix: str
    # Text appended to the prefix before the gap, special-token texts parsed (llama.cpp's
    # /infill ``prompt``: the part of the line before the cursor, for one).
    after_prefix: str = ""
    extra: tuple[FileContext, ...] = ()  # other files, before the prefix (repository-level FIM)
    # llama.cpp's /infill pattern: a repository header and file separators around the files,
    # and the prefix and suffix cut to fit one 2048-token batch. Off: the single-file pattern.
    repository: bool = False
    param: str = "suffix"  # the field named when the model has no FIM tokens


@dataclass(frozen=True)
class RawPrompt:
    """A prompt sent as is (legacy completions, /infill): no chat template, special-token texts
    parsed, BOS as the model's metadata says (as ``manage.py generate --raw``)."""

    text: str = ""
    tokens: tuple[int, ...] | None = None  # token ids sent instead of text
    fim: FillInMiddle | None = None  # the prompt is the prefix of a fill-in-the-middle
    param: str = "prompt"  # the field a problem with the prompt is reported on


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate, independent of the dialect it arrived in."""

    messages: tuple[Message, ...]
    sampling: SamplingOverrides = field(default_factory=SamplingOverrides)
    max_tokens: int | None = None  # None: the server default, always clamped to the context
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # The reasoning channel was asked for (and the backend has one): a leading think block
    # streams as ReasoningDelta events instead of reply text.
    reasoning: bool = False
    # The reply must match this grammar (a constrained reply never reasons).
    constraint: ConstraintSpec | None = None
    tools: tuple[ToolSpec, ...] = ()  # declared functions (the reply may call them)
    # The start of the reply, written by the client (an assistant prefill): rendered after the
    # generation prompt with the turn left open, so the reply is its continuation.
    prefill: str = ""
    stop_param: str = "stop"  # what the dialect calls ``stop`` (Anthropic: stop_sequences)
    logprobs: LogprobsRequest | None = None  # None: not asked (nothing is computed)
    # A raw prompt instead of a conversation (``messages`` is then empty): no chat template.
    raw: RawPrompt | None = None

    def template_messages(self) -> list[dict]:
        return [m.as_template_dict() for m in self.messages]


@dataclass(frozen=True)
class PreparedPrompt:
    """A validated request's prompt tokens and its generation budget."""

    tokens: list[int]
    max_tokens: int  # clamped to the room the context leaves after the prompt


@dataclass(frozen=True)
class Usage:
    """Token accounting of one request."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens reused from a resident KV cache
    reasoning_tokens: int = 0  # the part of completion_tokens spent in the reasoning channel

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log probability: ``data`` its bytes (which need not be valid UTF-8 alone: a
    code point may span tokens), ``top`` the most likely alternatives at its position, most
    likely first (empty for an alternative itself, or when none were asked for)."""

    data: bytes
    logprob: float
    top: tuple[TokenLogprob, ...] = ()

    @property
    def text(self) -> str:
        """The token as text, lossy where its bytes are not whole code points (U+FFFD)."""
        return self.data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class TextDelta:
    """Reply text, always whole code points, never part of a stop string. ``logprobs``: the
    tokens whose first reply character is in this text (when the request asked for them)."""

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class ReasoningDelta:
    """Reasoning text (the model's think block), routed apart from the reply; whole code points."""

    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """One completed function call of the reply (``index`` counts calls from 0)."""

    call: ToolCall
    index: int


@dataclass(frozen=True)
class Finish:
    """The reply ended normally; always the last event of a successful generation."""

    reason: FinishReason
    usage: Usage
    stop_sequence: str | None = None  # the stop string that ended the reply, if one did


@dataclass(frozen=True)
class ContextOverflow:
    """A prompt that leaves no room to reply: each dialect words this in the form its clients
    parse (they compact or trim the conversation on it)."""

    prompt_tokens: int
    n_ctx: int


@dataclass(frozen=True)
class Error:
    """The request failed; ``status`` is the HTTP status every dialect reports it with."""

    status: int
    message: str
    code: str | None = None
    param: str | None = None
    retry_after: int | None = None  # seconds, for overload answers (429, 503)
    overflow: ContextOverflow | None = None  # set for code "context_length_exceeded"


@dataclass(frozen=True)
class EmbeddingRequest:
    """Texts to embed (POST /v1/embeddings), in order; each gets one vector."""

    texts: tuple[str, ...]


@dataclass(frozen=True)
class PreparedEmbedding:
    """An embedding request tokenized by the embedding contract (inference.engine.embedding),
    every input checked against the context."""

    tokens: tuple[tuple[int, ...], ...]

    @property
    def prompt_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


@dataclass(frozen=True)
class Embeddings:
    """The worker's answer to an EmbeddingRequest: one unit vector (n_embd,) float32 per text,
    in order. Terminal, like Finish."""

    vectors: tuple[np.ndarray, ...]
    prompt_tokens: int


Event = TextDelta | ReasoningDelta | ToolCallDelta | Finish | Error | Embeddings


class Sink(Protocol):
    """Where the worker streams a request's events (a StreamPipe)."""

    @property
    def cancelled(self) -> bool: ...

    def push(self, event) -> None: ...

    def close(self, final: Finish | Error | Embeddings) -> None: ...

    def prefix_chosen(self, documents: tuple[str, ...]) -> None:
        """The prefix is chosen (before any event): the fleet documents it composes."""
