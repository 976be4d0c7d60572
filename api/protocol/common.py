"""What the dialects parse alike: the declarations of the fields they share (sampling fields
with their ranges, stop strings, model, reasoning effort, n, logit_bias, stream_options and
the llama.cpp extensions), the capability checks against the loaded model, and a call's
arguments.

Each dialect lists these declarations among its own (api/protocol/request_fields.py), in its
reference's order, so a range, a limit or an error's wording is stated once.
"""

from __future__ import annotations

import dataclasses
import json

from api.errors import ApiError, unsupported
from inference.generation.toolcall import ToolCall
from inference.types import SAMPLING_RANGES, SamplingOverrides, SamplingRange

from . import fields as f
from .fields import Invalid
from .request_fields import (
    Choice,
    Flag,
    Integer,
    RequestField,
    Sampling,
    Shape,
    StopStrings,
    Text,
    refuse_non_empty,
)

SAMPLING_FIELDS = tuple(field.name for field in dataclasses.fields(SamplingOverrides))
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
REASONING_OFF = (None, "none", "minimal")  # reasoning is off by default: these are honored as-is
MAX_OPENAI_STOP_STRINGS = 4
# Anthropic documents no limit on stop_sequences; this one is ours. Every stop string is scanned
# for on every decoded token, in Python, on the one worker thread that all streams of a lockstep
# batch share: about 0.85 us per string per token measured on the 2-core bench machine, so 16
# cost ~14 us a token (a fraction of a percent of a decode step) where 100 would cost ~85 us.
# 16 is four times OpenAI's limit: room for the handful of stop strings agent prompts use.
MAX_ANTHROPIC_STOP_SEQUENCES = 16
# Content parts no dialect takes (this server reads text only): type -> what it is, for the 400.
REFUSED_MEDIA_PARTS = {
    "image_url": "image input",
    "input_image": "image input",
    "input_audio": "audio input",
    "audio": "audio input",
    "file": "file input",
    "input_file": "file input",
}


def sampling_range(name: str, temperature_max: float = 2.0) -> SamplingRange:
    """The values the sampling field ``name`` takes in a dialect (Anthropic caps temperature
    at 1): what the parser checks and the OpenAPI document declares."""
    allowed = SAMPLING_RANGES[name]
    return allowed._replace(highest=temperature_max) if name == "temperature" else allowed


def sampling_field(
    name: str, description: str | None = None, *, temperature_max: float = 2.0
) -> RequestField:
    """The declaration of the sampling field ``name``, its range from :func:`sampling_range`."""
    return RequestField(name, Sampling(sampling_range(name, temperature_max)), description)


# -- fields declared alike by several dialects (each lists them in its reference's order) --------
MODEL = RequestField("model", Text(), "accepted and ignored: one process serves one model")
FREQUENCY_PENALTY = sampling_field("frequency_penalty")
PRESENCE_PENALTY = sampling_field("presence_penalty")
SEED = sampling_field("seed", "seeds the sampler: the same seed and request give the same reply")
TEMPERATURE = sampling_field("temperature")
TOP_P = sampling_field("top_p")
OPENAI_STOP = RequestField(
    "stop",
    StopStrings(single=True, limit=MAX_OPENAI_STOP_STRINGS),
    f"up to {MAX_OPENAI_STOP_STRINGS} non-empty strings that end the reply (not included)",
)
REASONING_EFFORT = RequestField(
    "reasoning_effort", Choice(EFFORTS), "anything above minimal needs a reasoning model"
)
# Extensions with llama.cpp precedent.
TOP_K = sampling_field("top_k", "extension (llama.cpp): sample among the k most likely tokens")
MIN_P = sampling_field("min_p", "extension (llama.cpp): drop tokens below min_p x the top probability")
REPEAT_PENALTY = sampling_field("repeat_penalty", "extension (llama.cpp)")
IGNORE_EOS = RequestField(
    "ignore_eos", Flag(), "extension (llama.cpp): keep generating past the end-of-turn token"
)
# The constraint extensions: combined with the dialect's reply format, at most one of them.
REGEX = RequestField(
    "regex", Text(), "extension: the reply must match this regular expression", combined=True
)
LARK = RequestField("lark", Text(), "extension: the reply must match this Lark grammar", combined=True)
# What the two OpenAI dialects take beyond OpenAI's reference, in this order (llama.cpp's sampling
# extensions, then the constraints).
OPENAI_EXTENSIONS = (TOP_K, MIN_P, REPEAT_PENALTY, IGNORE_EOS, REGEX, LARK)


def refuse_more_than_one(body: dict, name: str) -> None:
    """The reader of ``n`` (and ``best_of``): one choice per request."""
    count = f.integer(body, name, lo=1)
    if count is not None and count > 1:
        raise Invalid(unsupported(name, "> 1 is not supported: this server returns one choice"))


def parse_stream_options(body: dict, name: str) -> bool:
    """``stream_options.include_usage``: whether the stream ends with a usage chunk."""
    options = f.obj(body, name)
    if options is None:
        return False
    return bool(f.boolean(options, "include_usage", f"{name}.include_usage"))


N = RequestField(
    "n", Integer(lo=1, hi=1), refused="above 1 is refused: one choice per request", read=refuse_more_than_one
)
LOGIT_BIAS = RequestField(
    "logit_bias", Shape(), refused="a non-empty object is refused", read=refuse_non_empty(f.obj)
)
STREAM_OPTIONS = RequestField("stream_options", Shape(), combined=True, read=parse_stream_options)


def sampling_overrides(request: object) -> SamplingOverrides:
    """The sampling fields of an already-validated dialect request, read by name; a field the
    dialect does not have (Anthropic has no seed, for one) stays unset."""
    return SamplingOverrides(**{name: getattr(request, name, None) for name in SAMPLING_FIELDS})


def parse_effort(container: dict | None, name: str, param: str) -> str | None:
    """A reasoning effort (``reasoning_effort``, ``reasoning.effort``): one of :data:`EFFORTS`."""
    if container is None:
        return None
    effort = f.string(container, name, param)
    if effort is not None and effort not in EFFORTS:
        raise f.invalid_value(param, effort, f"one of {', '.join(EFFORTS)}")
    return effort


def wants_reasoning(effort: str | None) -> bool:
    return effort not in REASONING_OFF


def reasoning_unavailable(param: str, effort: str | None) -> ApiError:
    """A reasoning effort asked of a model without a reasoning channel."""
    return unsupported(
        param,
        f"{effort!r} needs a model with a reasoning channel, and this one has none; use 'none' or 'minimal'",
    )


def tools_unavailable(param: str) -> ApiError:
    """Tools (or a tool history) sent to a model without a function-calling convention."""
    return unsupported(param, "needs a model with a function-calling convention; this one has none")


def call_from(name: object, arguments: object, *, as_string: bool, as_object: bool) -> ToolCall | None:
    """A call a client replays, its arguments (a JSON object, given as JSON text when
    ``as_string``, as an object when ``as_object``) normalised to compact JSON text; None
    when the name or the arguments are not a call's."""
    parsed = None
    if as_string and isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
    elif as_object and isinstance(arguments, dict):
        parsed = arguments
    if not name or not isinstance(name, str) or not isinstance(parsed, dict):
        return None
    return ToolCall(name, json.dumps(parsed, ensure_ascii=False))
