"""llama.cpp's POST /tokenize and POST /detokenize (tools/server/README.md): the request
types and what they answer, with the model's own tokenizer (no model time, no queue).

``/tokenize`` takes ``content`` (text), ``add_special`` (prepend BOS as the model's metadata
says; default false), ``parse_special`` (special-token texts become their tokens; default
true) and ``with_pieces`` (each id with its piece: text when the token's bytes are UTF-8 on
their own, else the byte values). ``/detokenize`` takes ``tokens`` and answers ``content``, the
text (control tokens as their text); an id outside the vocabulary is a 400 naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.errors import ApiError, bad_request
from inference.engine.tokenizer import Tokenizer

from .. import fields as f
from ..fields import Invalid
from ..request_fields import Flag, RequestField, Shape, Text, read_fields

# The /tokenize body's fields, in the order of llama.cpp's README: what ``parse`` reads and
# what the OpenAPI document declares.
TOKENIZE_FIELDS = (
    RequestField("content", Text(), required=True),
    RequestField(
        "add_special", Flag(default=False), "prepend BOS as the model's metadata says (default false)"
    ),
    RequestField(
        "parse_special", Flag(default=True), "special-token texts become their tokens (default true)"
    ),
    RequestField(
        "with_pieces",
        Flag(default=False),
        "answer [{id, piece}] (piece: text, or byte values when not UTF-8)",
    ),
)


@dataclass(frozen=True, kw_only=True)
class TokenizeRequest:
    """A validated /tokenize request, fields in the order of llama.cpp's README (those of
    :data:`TOKENIZE_FIELDS`)."""

    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False

    @classmethod
    def parse(cls, body: dict) -> TokenizeRequest | ApiError:
        try:
            return cls(**read_fields(TOKENIZE_FIELDS, body).attributes())
        except Invalid as exc:
            return exc.error


def _parse_tokens(body: dict, name: str) -> tuple[int, ...]:
    tokens = f.array(body, name)
    for i, token in enumerate(tokens):
        if isinstance(token, bool) or not isinstance(token, int):
            raise f.wrong_type(f"{name}[{i}]", "an integer token id", token)
    return tuple(tokens)


DETOKENIZE_FIELDS = (RequestField("tokens", Shape(), required=True, read=_parse_tokens),)


@dataclass(frozen=True, kw_only=True)
class DetokenizeRequest:
    """A validated /detokenize request (the field of :data:`DETOKENIZE_FIELDS`)."""

    tokens: tuple[int, ...]

    @classmethod
    def parse(cls, body: dict) -> DetokenizeRequest | ApiError:
        try:
            return cls(**read_fields(DETOKENIZE_FIELDS, body).attributes())
        except Invalid as exc:
            return exc.error


def _piece(tokenizer: Tokenizer, token: int) -> str | list[int]:
    data = tokenizer.token_bytes(token, special=True)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


def tokenize(tokenizer: Tokenizer, request: TokenizeRequest) -> dict:
    """``{"tokens": [id, ...]}``, or with pieces ``{"tokens": [{"id", "piece"}, ...]}``."""
    add_bos = request.add_special and tokenizer.add_bos and tokenizer.bos_id is not None
    ids = tokenizer.encode(request.content, add_bos=add_bos, parse_special=request.parse_special)
    if request.with_pieces:
        return {"tokens": [{"id": token, "piece": _piece(tokenizer, token)} for token in ids]}
    return {"tokens": ids}


def detokenize(tokenizer: Tokenizer, request: DetokenizeRequest) -> dict | ApiError:
    """``{"content": text}``; a 400 naming the ids outside the vocabulary."""
    outside = [(i, t) for i, t in enumerate(request.tokens) if not 0 <= t < tokenizer.vocab_size]
    if outside:
        where, token = outside[0]
        ids = ", ".join(str(t) for _, t in outside[:8])
        return bad_request(
            f"Invalid value for 'tokens[{where}]': token ids {ids} are outside the vocabulary "
            f"(0..{tokenizer.vocab_size - 1})",
            f"tokens[{where}]",
        )
    return {"content": tokenizer.decode(request.tokens)}
