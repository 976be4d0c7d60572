"""OpenAI (legacy) Completions: request validation (the encoder is in ``encoder.py``).

``CompletionRequest.parse`` turns a JSON object into a validated request or an ApiError (a
value, never an exception). The prompt is raw text (or token ids): no chat template, special
tokens' texts parsed, BOS as the model's metadata says, as ``manage.py generate --raw`` reads
it. ``suffix`` asks for fill-in-the-middle on a model with FIM tokens. One prompt and one
choice per request; fields this server cannot honour are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.errors import ApiError, bad_request, unsupported
from inference.types import FillInMiddle, GenerationRequest, LogprobsRequest, RawPrompt

from .. import fields as f
from ..common import OPENAI_SAMPLING, parse_openai_stop, parse_sampling, sampling_overrides
from ..fields import Invalid

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this endpoint (Chat's is the server's)
MAX_LOGPROBS = 5  # OpenAI's bound on this endpoint's alternatives per token


@dataclass(frozen=True)
class CompletionRequest:
    """A validated request; fields in the order of OpenAI's reference, then our extensions."""

    model: str | None = None  # accepted and ignored: one process serves one model
    prompt: str = ""  # the prompt text ("" when it was sent as token ids)
    prompt_tokens: tuple[int, ...] | None = None  # the prompt as token ids, when sent so
    echo: bool = False  # the reply starts with the prompt
    frequency_penalty: float | None = None
    logprobs: int | None = None  # alternatives per token (0..5); None: no log probabilities
    max_tokens: int = DEFAULT_MAX_TOKENS
    presence_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage
    suffix: str | None = None  # the text after the completion: fill-in-the-middle
    temperature: float | None = None
    top_p: float | None = None
    # Extensions with llama.cpp precedent.
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    ignore_eos: bool = False

    @classmethod
    def parse(cls, body: dict) -> CompletionRequest | ApiError:
        """Validate a decoded JSON object; the first problem found is returned as an ApiError."""
        try:
            _refuse_unsupported(body)
            text, tokens = parse_prompt(body.get("prompt"))
            max_tokens = f.integer(body, "max_tokens", lo=1)
            return cls(
                model=f.string(body, "model"),
                prompt=text,
                prompt_tokens=tokens,
                echo=bool(f.boolean(body, "echo")),
                logprobs=f.integer(body, "logprobs", lo=0, hi=MAX_LOGPROBS),
                max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
                **parse_sampling(body, OPENAI_SAMPLING),
                stop=parse_openai_stop(body.get("stop")),
                stream=bool(f.boolean(body, "stream")),
                include_usage=_parse_stream_options(body),
                # An empty suffix is no suffix: nothing follows the completion.
                suffix=f.string(body, "suffix") or None,
                ignore_eos=bool(f.boolean(body, "ignore_eos")),
            )
        except Invalid as exc:
            return exc.error

    def to_generation(self) -> GenerationRequest:
        """The dialect-free request: the raw prompt, with the FIM suffix if one was sent."""
        fim = FillInMiddle(self.suffix) if self.suffix is not None else None
        raw = RawPrompt(self.prompt, self.prompt_tokens, fim)
        logprobs = LogprobsRequest(self.logprobs, "logprobs") if self.logprobs is not None else None
        return GenerationRequest(
            messages=(),
            sampling=sampling_overrides(self),
            max_tokens=self.max_tokens,
            stop=self.stop,
            ignore_eos=self.ignore_eos,
            raw=raw,
            logprobs=logprobs,
        )


def parse_prompt(value: object) -> tuple[str, tuple[int, ...] | None]:
    """``prompt``: a string, an array of token ids, or a one-element array of either (the
    prompt text, or "" and the ids). Several prompts are a 400: one prompt per request."""
    if value is None:
        raise Invalid(bad_request("'prompt' is required", "prompt", "missing_required_parameter"))
    if isinstance(value, list) and value and all(isinstance(item, (str, list)) for item in value):
        if len(value) > 1:
            raise Invalid(
                unsupported(
                    "prompt", f"with {len(value)} prompts is not supported: send one prompt per request"
                )
            )
        value = value[0]
    if isinstance(value, str):
        return value, None
    if not isinstance(value, list):
        raise f.wrong_type("prompt", "a string or an array of token ids", value)
    if not value:
        raise Invalid(bad_request("'prompt' must not be an empty array", "prompt"))
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise f.wrong_type("prompt", "a string or an array of integer token ids", value)
    return "", tuple(value)


def _refuse_unsupported(body: dict) -> None:
    for name in ("n", "best_of"):
        count = f.integer(body, name, lo=1)
        if count is not None and count > 1:
            raise Invalid(unsupported(name, "> 1 is not supported: this server returns one choice"))
    if f.obj(body, "logit_bias"):
        raise Invalid(unsupported("logit_bias"))


def _parse_stream_options(body: dict) -> bool:
    options = f.obj(body, "stream_options")
    if options is None:
        return False
    return bool(f.boolean(options, "include_usage", "stream_options.include_usage"))
