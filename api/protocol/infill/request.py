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

from .. import fields as f
from ..common import parse_sampling, parse_stop_strings, sampling_overrides
from ..fields import Invalid

INFILL_SAMPLING = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
)


@dataclass(frozen=True)
class InfillRequest:
    """A validated request, fields in the order of llama.cpp's README."""

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
            return cls(
                input_prefix=f.string(body, "input_prefix") or "",
                input_suffix=f.string(body, "input_suffix") or "",
                input_extra=parse_extra(body),
                prompt=f.string(body, "prompt") or "",
                n_predict=_parse_n_predict(body),
                stream=bool(f.boolean(body, "stream")),
                stop=parse_stop_strings(body.get("stop"), "stop", single=True),
                **parse_sampling(body, INFILL_SAMPLING),
                ignore_eos=bool(f.boolean(body, "ignore_eos")),
            )
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


def _parse_n_predict(body: dict) -> int | None:
    """``n_predict`` (else ``max_tokens``, as llama.cpp reads it): -1 (or absent) lets the reply
    run to the context's end; 0 asks for nothing, and is refused."""
    name = "n_predict" if body.get("n_predict") is not None else "max_tokens"
    value = f.integer(body, name, lo=-1)
    if value == 0:
        raise Invalid(bad_request(f"'{name}' must be -1 (no limit) or at least 1, not 0", name))
    return None if value is None or value < 0 else value
