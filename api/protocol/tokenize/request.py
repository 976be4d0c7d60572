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


@dataclass(frozen=True)
class TokenizeRequest:
    """A validated /tokenize request, fields in the order of llama.cpp's README."""

    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False

    @classmethod
    def parse(cls, body: dict) -> TokenizeRequest | ApiError:
        try:
            content = f.string(body, "content")
            if content is None:
                raise Invalid(bad_request("'content' is required", "content", "missing_required_parameter"))
            parse_special = f.boolean(body, "parse_special")
            return cls(
                content=content,
                add_special=bool(f.boolean(body, "add_special")),
                parse_special=True if parse_special is None else parse_special,
                with_pieces=bool(f.boolean(body, "with_pieces")),
            )
        except Invalid as exc:
            return exc.error


@dataclass(frozen=True)
class DetokenizeRequest:
    """A validated /detokenize request."""

    tokens: tuple[int, ...]

    @classmethod
    def parse(cls, body: dict) -> DetokenizeRequest | ApiError:
        try:
            tokens = f.array(body, "tokens")
            if tokens is None:
                raise Invalid(bad_request("'tokens' is required", "tokens", "missing_required_parameter"))
            for i, token in enumerate(tokens):
                if isinstance(token, bool) or not isinstance(token, int):
                    raise f.wrong_type(f"tokens[{i}]", "an integer token id", token)
            return cls(tuple(tokens))
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
