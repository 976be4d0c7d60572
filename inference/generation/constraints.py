"""Constrained decoding with llguidance: a grammar decides which tokens may come next.

A request's :class:`ConstraintSpec` (a JSON schema, a regex or a Lark grammar) is checked on
the connection side (:meth:`ConstraintCompiler.validate`, a 400 carrying llguidance's message
when it is invalid) and turned into a :class:`TokenConstraint` on the worker. Compiling a
grammar walks the whole vocabulary, so compiled base matchers are kept in an LRU cache keyed
by grammar source and cloned per request; only the worker thread touches that cache.
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from decimal import Decimal, localcontext

import llguidance
import numpy as np

from inference.engine.tokenizer import Tokenizer
from inference.types import ConstraintKind, ConstraintSpec

__all__ = ["ConstraintKind", "ConstraintSpec"]  # defined with the request (inference.types)

CACHED_GRAMMARS = 32
# Fixed separators: with free whitespace a model may pad a JSON reply until its budget runs out.
JSON_OPTIONS = {"whitespace_flexible": False}
# Digit bounds for numbers a schema leaves open, in the spirit of llama.cpp's JSON grammars: greedy
# decoding inside an open number can append digits until the token budget runs out. The integral
# bound is the interoperable-integer limit (I-JSON, 2**53 - 1, 16 digits); the fraction bound is
# the finest ``multipleOf`` llguidance takes exactly (coarser powers of ten drift in its f64 loop).
SAFE_INTEGER = 2**53 - 1
FRACTION_DIGITS = 10
FLOAT_DIGITS = 400  # decimal digits that hold any f64 bound scaled by 10**FRACTION_DIGITS
# Keywords holding subschemas (by name, or a schema or list of them) that the rewrite descends
# into; "not" and "if" are left alone, since tightening them would loosen the schema around them.
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
SCHEMA_KEYWORDS = (
    "anyOf",
    "oneOf",
    "allOf",
    "prefixItems",
    "items",
    "additionalItems",
    "additionalProperties",
)


def grammar_of(spec: ConstraintSpec) -> str:
    """The llguidance grammar text of ``spec`` (a JSON schema with its open numbers
    bounded, see :func:`bound_number_digits`)."""
    if spec.kind == "json_schema":
        schema = json.dumps(bound_number_digits(json.loads(spec.source)))
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    if spec.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.source)
    if spec.kind == "tool_call":
        raise ValueError("a forced call becomes a grammar only with the family's call convention")
    return llguidance.LLMatcher.grammar_from_lark(spec.source)


def bound_number_digits(schema: object) -> object:
    """A copy of ``schema`` whose ``integer`` and ``number`` subschemas have bounded digits.

    A side without a bound gets ``±SAFE_INTEGER``; a ``number`` without ``multipleOf`` gets
    ``multipleOf`` 10**-FRACTION_DIGITS, which llguidance applies to the text (at most that many
    fraction digits, no exponent). Bounds, ``multipleOf``, ``enum`` and ``const`` the schema
    states are kept as they are, and nothing is added that would exclude a value the schema
    states as a bound: the result accepts a subset of what ``schema`` accepts."""
    if isinstance(schema, list):
        return [bound_number_digits(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: bound_number_digits(sub) for name, sub in out[key].items()}
    for key in SCHEMA_KEYWORDS:
        if isinstance(out.get(key), (dict, list)):
            out[key] = bound_number_digits(out[key])
    types = out.get("type")
    types = {types} if isinstance(types, str) else set(types) if isinstance(types, list) else set()
    if types & {"integer", "number"} and "enum" not in out and "const" not in out:
        _bound_numeric(out, fraction="number" in types)
    return out


def _bound_numeric(schema: dict, fraction: bool) -> None:
    """Add the missing digit bounds to one numeric schema, in place."""
    low = _stated_bound(schema, "minimum", "exclusiveMinimum")
    high = _stated_bound(schema, "maximum", "exclusiveMaximum")
    # A stated bound beyond the safe range keeps the other side open rather than empty the range;
    # a keyword present with a malformed value is left for llguidance to report.
    if "minimum" not in schema and low is None and (high is None or high[0] > -SAFE_INTEGER):
        schema["minimum"] = -SAFE_INTEGER
    if "maximum" not in schema and high is None and (low is None or low[0] < SAFE_INTEGER):
        schema["maximum"] = SAFE_INTEGER
    if fraction and "multipleOf" not in schema and _has_fraction_multiple(low, high):
        schema["multipleOf"] = float(f"1e-{FRACTION_DIGITS}")


def _stated_bound(schema: dict, inclusive: str, exclusive: str) -> tuple[Decimal, bool] | None:
    """The tighter of a side's stated bounds: (value, exclusive), or None when it is open."""
    found = []
    if _is_number(schema.get(inclusive)):
        found.append((Decimal(repr(schema[inclusive])), schema.get(exclusive) is True))
    if _is_number(schema.get(exclusive)):
        found.append((Decimal(repr(schema[exclusive])), True))
    if not found:
        return None
    lower = inclusive == "minimum"
    return max(found) if lower else min(found, key=lambda bound: (bound[0], not bound[1]))


def _has_fraction_multiple(low: tuple[Decimal, bool] | None, high: tuple[Decimal, bool] | None) -> bool:
    """Whether the stated bounds are exact at the fraction bound and leave a multiple of it
    between them (so adding ``multipleOf`` never empties the range or moves an end)."""
    ends = [bound[0] for bound in (low, high) if bound is not None]
    if any(value.normalize().as_tuple().exponent < -FRACTION_DIGITS for value in ends):
        return False
    if low is None or high is None:
        return True
    with localcontext(prec=FLOAT_DIGITS):  # exact for any f64 bound, 1e308 included
        first = low[0].scaleb(FRACTION_DIGITS) + (1 if low[1] else 0)  # bounds are exact multiples
        last = high[0].scaleb(FRACTION_DIGITS) - (1 if high[1] else 0)
        return first <= last


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def build_lltokenizer(tokenizer: Tokenizer, stop_ids: frozenset[int] | None = None) -> llguidance.LLTokenizer:
    """The tokenizer bridge: our GGUF vocabulary as llguidance sees it (each token's bytes,
    control tokens marked special so no grammar text can produce them); ``stop_ids`` end a
    turn (the engine's: the vocabulary's end-of-generation ids and the family's stop tokens)."""
    stop_ids = tokenizer.eog_ids if stop_ids is None else stop_ids
    tokens, special = [], []
    for token_id in range(tokenizer.vocab_size):
        if tokenizer.is_control(token_id):
            special.append(token_id)
            tokens.append(tokenizer.token_bytes(token_id, special=True))
        else:
            tokens.append(tokenizer.token_bytes(token_id))
    eos = tokenizer.eos_id if tokenizer.eos_id is not None else min(stop_ids, default=0)
    wrapper = _VocabularyWrapper(tokenizer, tokens, special, eos)
    eog = sorted(stop_ids) or [eos]
    return llguidance.LLTokenizer(wrapper, n_vocab=tokenizer.vocab_size, eos_token=eog)


class _VocabularyWrapper(llguidance.TokenizerWrapper):
    """The duck-typed object LLTokenizer reads: token bytes, special ids and an encoder."""

    def __init__(self, tokenizer: Tokenizer, tokens: list[bytes], special: list[int], eos: int):
        self.eos_token_id = eos
        self.bos_token_id = tokenizer.bos_id
        self.tokens = tokens
        self.special_token_ids = special
        self.is_tokenizer_wrapper = True
        self._tokenizer = tokenizer

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode(text, add_bos=False, parse_special=False)


class ConstraintCompiler:
    """Validates constraint specs and hands out per-request matchers for one vocabulary."""

    def __init__(
        self, tokenizer: Tokenizer, cache_size: int = CACHED_GRAMMARS, stop_ids: frozenset[int] | None = None
    ):
        self.lltokenizer = build_lltokenizer(tokenizer, stop_ids)
        self.vocab_size = tokenizer.vocab_size
        self.cache_size = cache_size
        self._base: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._owner: int | None = None  # the one thread allowed to touch _base

    def validate(self, spec: ConstraintSpec) -> str | None:
        """llguidance's error message when the constraint cannot be compiled, else None.
        Safe on any thread: it compiles a throwaway copy."""
        try:
            grammar = grammar_of(spec)
        except (ValueError, TypeError, RuntimeError) as exc:
            return str(exc)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.lltokenizer)
        return messages[0] if is_error else None

    def constraint(self, spec: ConstraintSpec) -> TokenConstraint:
        """A fresh constraint for one request, cloned from the cached compiled grammar."""
        self._check_thread()
        grammar = grammar_of(spec)
        base = self._base.get(grammar)
        if base is None:
            base = llguidance.LLMatcher(self.lltokenizer, grammar, log_level=0)
            if base.is_error():
                raise ValueError(base.get_error())
            self._base[grammar] = base
            while len(self._base) > self.cache_size:
                self._base.popitem(last=False)
        self._base.move_to_end(grammar)
        return TokenConstraint(base.deep_copy(), self.vocab_size)

    @property
    def cached(self) -> int:
        return len(self._base)

    def _check_thread(self) -> None:
        me = threading.get_ident()
        if self._owner is None:
            self._owner = me
        elif self._owner != me:
            raise RuntimeError("compiled grammars are owned by the worker thread")


class ConstraintDeadEnd(RuntimeError):
    """The grammar allows no next token (no token of the vocabulary continues a match)."""


class TokenConstraint:
    """One request's matcher: the allowed-token mask before each sample, then the token."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int):
        self.matcher = matcher
        self.vocab_size = vocab_size

    def allowed(self, n_logits: int) -> np.ndarray:
        """Boolean mask over the model's ``n_logits`` outputs (padding rows never allowed).
        Raises ConstraintDeadEnd when no token may come next: llguidance then falls back to
        allowing only the end of the turn, which would pass for an empty, finished reply."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        if self.matcher.is_error():
            detail = (self.matcher.get_error() or "").splitlines()
            raise ConstraintDeadEnd(detail[0].strip() if detail else "the matcher failed")
        mask = np.unpackbits(bits, bitorder="little").astype(bool)  # (32 * words,)
        out = np.zeros(n_logits, dtype=bool)  # (n_logits,)
        n = min(n_logits, self.vocab_size, mask.shape[0])
        out[:n] = mask[:n]
        if not out.any():
            raise ConstraintDeadEnd("no token of the vocabulary continues the match")
        return out

    def accept(self, token: int) -> bool:
        """Advance past ``token``; True when the grammar is complete (the turn must end)."""
        if not self.matcher.consume_token(token):
            raise ValueError(f"constraint rejected token {token}: {self.matcher.get_error()}")
        return self.matcher.is_stopped()

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of ``tokens`` the grammar would take in a row from here (the matcher's
        state does not change): a speculative draft is cut there before it is verified."""
        return self.matcher.validate_tokens(list(tokens))

    @property
    def completed(self) -> bool:
        """Whether the grammar is finished: nothing but the end of the turn may follow."""
        return self.matcher.is_stopped()

    @property
    def satisfied(self) -> bool:
        """Whether the reply so far is a complete match."""
        return self.matcher.is_accepting()
