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

from .. import common
from .. import fields as f
from ..common import sampling_overrides
from ..fields import Invalid
from ..request_fields import Flag, Integer, RequestField, Shape, Text, read_fields

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this endpoint (Chat's is the server's)
MAX_LOGPROBS = 5  # OpenAI's bound on this endpoint's alternatives per token

# The request body's fields, in the order of OpenAI's reference, then the extensions: what
# ``parse`` reads and what the OpenAPI document declares (api/openapi/openai_requests.py gives
# the Shape fields' structures). The lambda looks up parse_prompt, defined further down.
FIELDS = (
    common.MODEL,
    RequestField(
        "prompt", Shape(), required=True, combined=True, read=lambda body, name: parse_prompt(body.get(name))
    ),
    RequestField(
        "best_of",
        Integer(lo=1, hi=1),
        refused="above 1 is refused: one choice per request",
        read=common.refuse_more_than_one,
    ),
    RequestField("echo", Flag(), "the reply text starts with the prompt"),
    common.FREQUENCY_PENALTY,
    common.LOGIT_BIAS,
    RequestField(
        "logprobs",
        Integer(lo=0, hi=MAX_LOGPROBS),
        "each token's log probability, with this many alternatives (choices[0].logprobs)",
    ),
    RequestField(
        "max_tokens",
        Integer(lo=1),
        "reply budget; default 16, clamped to what --ctx leaves",
        combined=True,
    ),
    common.N,
    common.PRESENCE_PENALTY,
    common.SEED,
    common.OPENAI_STOP,
    RequestField("stream", Flag(), "answer as server-sent text_completion chunks, then data: [DONE]"),
    common.STREAM_OPTIONS,
    RequestField(
        "suffix",
        Text(),
        "the text after the completion: fill-in-the-middle, on a model with FIM tokens (400 "
        "naming suffix on others); empty is none",
        combined=True,
    ),
    common.TEMPERATURE,
    common.TOP_P,
    RequestField("user", Text(), ignored=True),
    common.TOP_K,
    common.MIN_P,
    common.REPEAT_PENALTY,
    common.IGNORE_EOS,
)


@dataclass(frozen=True, kw_only=True)
class CompletionRequest:
    """A validated request; fields in the order of OpenAI's reference, then our extensions.

    Each field of :data:`FIELDS` that is not combined, refused or ignored becomes the attribute
    of the same name; the others are what ``parse`` makes of the combined ones."""

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
            read = read_fields(FIELDS, body)
            text, tokens = read["prompt"]
            max_tokens = read["max_tokens"]
            return cls(
                **read.attributes(),
                prompt=text,
                prompt_tokens=tokens,
                max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
                include_usage=read["stream_options"],
                # An empty suffix is no suffix: nothing follows the completion.
                suffix=read["suffix"] or None,
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
