"""OpenAI Embeddings: request validation.

``EmbeddingsRequest.parse`` turns a JSON object into a validated request or an ApiError (a
value, never an exception). ``input`` is a string or an array of strings; token-id arrays are
refused by name (the embedding contract appends its suffix to *text*). ``dimensions`` is
honoured only when it equals the model's width: the vector is the model's own hidden state,
and truncating it would not give the normalised vector OpenAI's shortened embeddings are.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.errors import ApiError, bad_request, unsupported
from inference.types import EmbeddingRequest

from .. import common
from .. import fields as f
from ..fields import Invalid
from ..request_fields import Choice, Integer, RequestField, Shape, Text, read_fields

ENCODING_FORMATS = ("float", "base64")
MAX_INPUTS = 2048  # OpenAI's limit on the array form


def _parse_encoding_format(body: dict, name: str) -> str:
    encoding = f.string(body, name)
    if encoding is not None and encoding not in ENCODING_FORMATS:
        raise f.invalid_value(name, encoding, "'float' or 'base64'")
    return encoding or "float"


# The request body's fields, in the order of OpenAI's reference: what ``parse`` reads and what
# the OpenAPI document declares (api/openapi/openai_requests.py gives input's shape). The
# lambda looks up parse_input, defined further down.
FIELDS = (
    RequestField(
        "input", Shape(), required=True, combined=True, read=lambda body, name: parse_input(body.get(name))
    ),
    common.MODEL,
    RequestField("dimensions", Integer(lo=1), "only the model's own width is accepted"),
    RequestField(
        "encoding_format",
        Choice(ENCODING_FORMATS),
        "base64: little-endian float32",
        read=_parse_encoding_format,
    ),
    RequestField("user", Text(), ignored=True),
)


@dataclass(frozen=True, kw_only=True)
class EmbeddingsRequest:
    """A validated request (``texts`` is the ``input`` field; the others those of :data:`FIELDS`)."""

    texts: tuple[str, ...]
    model: str | None = None  # accepted and ignored: one process serves one model
    encoding_format: str = "float"
    dimensions: int | None = None
    stream = False  # embeddings are answered whole

    @classmethod
    def parse(cls, body: dict) -> EmbeddingsRequest | ApiError:
        """Validate a decoded JSON object; the first problem found is returned as an ApiError."""
        try:
            read = read_fields(FIELDS, body)
            return cls(**read.attributes(), texts=read["input"])
        except Invalid as exc:
            return exc.error

    def check_dimensions(self, n_embd: int) -> ApiError | None:
        """A 400 naming ``dimensions`` unless it is absent or the model's own width."""
        if self.dimensions is None or self.dimensions == n_embd:
            return None
        return unsupported(
            "dimensions", f"must be {n_embd} (this model's embedding width) or absent, not {self.dimensions}"
        )

    def to_embedding(self) -> EmbeddingRequest:
        return EmbeddingRequest(texts=self.texts)


def parse_input(value: object) -> tuple[str, ...]:
    """``input``: a non-empty string, or an array of 1..MAX_INPUTS non-empty strings."""
    if value is None:
        raise Invalid(bad_request("'input' is required", "input", "missing_required_parameter"))
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list):
        raise f.wrong_type("input", "a string or an array of strings", value)
    if not texts:
        raise Invalid(bad_request("'input' must not be an empty array", "input"))
    if len(texts) > MAX_INPUTS:
        raise Invalid(
            bad_request(f"'input' holds {len(texts)} items; at most {MAX_INPUTS} are allowed", "input")
        )
    for index, text in enumerate(texts):
        if isinstance(text, (int, list)) and not isinstance(text, bool):
            raise Invalid(
                unsupported("input", "as token ids is not supported by this server; send the text itself")
            )
        if not isinstance(text, str):
            raise f.wrong_type(f"input[{index}]", "a string", text)
        if not text:
            raise Invalid(
                bad_request(f"'input[{index}]' is an empty string; every input needs text", "input")
            )
        surrogate = f.lone_surrogate_at(text)
        if surrogate is not None:
            raise Invalid(bad_request(f"'input[{index}]' holds a lone surrogate, which is not text", "input"))
    return tuple(texts)
