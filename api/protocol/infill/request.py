"""llama.cpp's POST /infill: request validation (the encoder is in ``encoder.py``).

The fields are llama.cpp's (tools/server/README.md, "POST /infill"): ``input_prefix`` and
``input_suffix`` around the gap, ``input_extra`` (other files of the project, as
``{"filename", "text"}``) before them, ``prompt`` appended to the prefix, and the sampling
fields of llama.cpp's /completion. The prompt is built as llama.cpp builds it (repository
pattern, see inference/generation/prompts.py). Fields that tune llama.cpp's own scheduler
(``cache_prompt``, ``samplers``, ``t_max_prompt_ms``, ``t_max_predict_ms``, ``n_indent``,
``id_slot``, ``response_fields``) are accepted and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.errors import ApiError, bad_request
from inference.types import FileContext, FillInMiddle, GenerationRequest, RawPrompt

from .. import common
from .. import fields as f
from ..common import sampling_overrides
from ..fields import Invalid
from ..request_fields import (
    Anything,
    Flag,
    Integer,
    RequestField,
    Shape,
    StopStrings,
    Text,
    as_sent,
    read_fields,
)

SCHEDULER = "llama-server's scheduler: accepted and ignored"


def _parse_n_predict(body: dict, name: str) -> int | None:
    """``n_predict`` (else ``max_tokens``, as llama.cpp reads it): -1 (or absent) lets the reply
    run to the context's end; 0 asks for nothing, and is refused."""
    name = name if body.get(name) is not None else "max_tokens"
    value = f.integer(body, name, lo=-1)
    if value == 0:
        raise Invalid(bad_request(f"'{name}' must be -1 (no limit) or at least 1, not 0", name))
    return None if value is None or value < 0 else value


# The request body's fields, in the order of llama.cpp's README: what ``parse`` reads and what
# the OpenAPI document declares (api/openapi/llamacpp_requests.py gives input_extra's shape).
FIELDS = (
    RequestField("input_prefix", Text(default=""), "the text before the gap"),
    RequestField(
        "input_suffix",
        Text(default=""),
        "the text after the gap (400 naming it on a model without FIM tokens)",
    ),
    RequestField("input_extra", Shape(), read=lambda body, _name: parse_extra(body)),
    RequestField("prompt", Text(default=""), "appended to the prefix (special-token texts parsed)"),
    RequestField(
        "n_predict",
        Integer(lo=-1),
        "reply budget; -1 or absent: the server's default",
        read=_parse_n_predict,
    ),
    RequestField("max_tokens", Integer(lo=-1), "read when n_predict is absent", combined=True, read=as_sent),
    RequestField("stream", Flag(), "answer as data: chunks {content, stop: false}, then one with stop: true"),
    RequestField("stop", StopStrings(single=True), "strings that end the reply (not included)"),
    common.TEMPERATURE,
    common.TOP_K,
    common.TOP_P,
    common.MIN_P,
    common.REPEAT_PENALTY,
    common.PRESENCE_PENALTY,
    common.FREQUENCY_PENALTY,
    common.SEED,
    common.IGNORE_EOS,
    *(
        RequestField(name, Anything(), SCHEDULER, ignored=True)
        for name in ("cache_prompt", "samplers", "t_max_prompt_ms", "t_max_predict_ms", "n_indent", "id_slot")
    ),
    RequestField(
        "response_fields", Anything(), "accepted and ignored: the whole answer is sent", ignored=True
    ),
)


@dataclass(frozen=True, kw_only=True)
class InfillRequest:
    """A validated request, fields in the order of llama.cpp's README (each field of
    :data:`FIELDS` that is neither combined nor ignored is the attribute of the same name)."""

    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: tuple[FileContext, ...] = ()
    prompt: str = ""  # appended to the prefix (the start of the line being written, say)
    n_predict: int | None = None  # None (llama.cpp's -1): the server's default budget
    stream: bool = False
    stop: tuple[str, ...] = ()
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    ignore_eos: bool = False

    @classmethod
    def parse(cls, body: dict) -> InfillRequest | ApiError:
        """Validate a decoded JSON object; the first problem found is returned as an ApiError."""
        try:
            return cls(**read_fields(FIELDS, body).attributes())
        except Invalid as exc:
            return exc.error

    def to_generation(self) -> GenerationRequest:
        fim = FillInMiddle(
            self.input_suffix, self.prompt, self.input_extra, repository=True, param="input_suffix"
        )
        raw = RawPrompt(self.input_prefix, fim=fim, param="input_prefix")
        return GenerationRequest(
            messages=(),
            sampling=sampling_overrides(self),
            max_tokens=self.n_predict,
            stop=self.stop,
            ignore_eos=self.ignore_eos,
            raw=raw,
        )


def parse_extra(body: dict) -> tuple[FileContext, ...]:
    """``input_extra``: an array of ``{"filename": string, "text": string}`` (filename
    defaults to llama.cpp's "tmp")."""
    chunks = f.array(body, "input_extra") or []
    extra = []
    for i, chunk in enumerate(chunks):
        where = f"input_extra[{i}]"
        if not isinstance(chunk, dict):
            raise f.wrong_type(where, 'an object {"filename": string, "text": string}', chunk)
        text = f.string(chunk, "text", f"{where}.text")
        if text is None:
            raise Invalid(
                bad_request(f"'{where}.text' is required", f"{where}.text", "missing_required_parameter")
            )
        extra.append(FileContext(f.string(chunk, "filename", f"{where}.filename") or "tmp", text))
    return tuple(extra)
