"""The vocabulary facts llama.cpp derives from GGUF metadata, and its special-token partition.

Mirrors llama.cpp's ``llama_vocab::impl::load`` for the parts that change tokenization or
generation: token attributes (from ``tokenizer.ggml.token_type``, upgraded to CONTROL for
tokens llama.cpp recognizes by name), BOS/EOS defaults, ``add_bos`` defaults, the
end-of-generation set and the ordered list of tokens that are cut out of raw text before the
model's own algorithm runs.

Not mirrored: the per-model LSTRIP/RSTRIP attributes llama.cpp sets for phi-3, jina and
modern-bert vocabularies (none of the served families).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import gguf
import numpy as np

K = gguf.Keys.Tokenizer

# llama_token_attr bits
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5

# GGUF token_type value -> attribute; unknown values become UNDEFINED like llama.cpp
_TYPE_TO_ATTR = np.array(
    [ATTR_UNDEFINED, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_CONTROL, ATTR_USER_DEFINED, ATTR_UNUSED, ATTR_BYTE],
    dtype=np.int32,
)
SPECIAL_ATTRS = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN

# Token texts llama.cpp's loader recognizes by name (llama-vocab.cpp, "auto-detect special tokens").
EOT_NAMES = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
)
EOM_NAMES = ("<|eom_id|>",)
FIM_NAMES = {
    K.FIM_PRE_ID: (
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ),
    K.FIM_SUF_ID: (
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ),
    K.FIM_MID_ID: (
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ),
    K.FIM_PAD_ID: ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    K.FIM_REP_ID: ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    K.FIM_SEP_ID: ("<|file_sep|>",),
}
_DEPRECATED_FIM_KEYS = {K.PREFIX_ID: K.FIM_PRE_ID, K.SUFFIX_ID: K.FIM_SUF_ID, K.MIDDLE_ID: K.FIM_MID_ID}
EOG_NAMES = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
)
ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


class TokenizerError(ValueError):
    """The GGUF's tokenizer metadata cannot be used; the message says why."""


@dataclass
class Vocabulary:
    """Token texts, attributes and special ids of one GGUF vocabulary."""

    model: str  # tokenizer.ggml.model: "gpt2" (BPE) or "llama" (SentencePiece)
    tokens: list[str]
    attrs: list[int]
    token_to_id: dict[str, int]
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    add_space_prefix: bool
    eog_ids: frozenset[int]
    special_ids: list[int]  # partition order: longest UTF-8 text first
    scores: list[float] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.tokens)

    def partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Split ``text`` into raw-text pieces and special token ids, as llama.cpp does.

        Each special token (longest first) is cut out of every remaining raw piece at all its
        non-overlapping leftmost occurrences. Without ``parse_special`` control and unknown
        tokens are left in the text; user-defined ones are still cut out, as in llama.cpp.
        """
        if not text:
            return []
        fragments: list[str | int] = [text]
        for token_id in self._candidates(text, parse_special):
            token_text = self.tokens[token_id]
            if not any(isinstance(f, str) and token_text in f for f in fragments):
                continue
            fragments = list(_split_fragments(fragments, token_text, token_id))
        return fragments

    def break_control_texts(self, text: str, mark: str) -> str:
        """``text`` with ``mark`` after the first character of every occurrence of a control or
        unknown token's text, so that ``partition(parse_special=True)`` leaves them as text.
        (A one-character token text cannot be broken; no vocabulary we know has one.)"""
        cuts: set[int] = set()
        for token_id in self._candidates(text, parse_special=True):
            if not self.attrs[token_id] & (ATTR_CONTROL | ATTR_UNKNOWN):
                continue  # user-defined tokens are recognized in plain text too, as in llama.cpp
            token_text = self.tokens[token_id]
            start = text.find(token_text)
            while start != -1:
                cuts.add(start + 1)
                start = text.find(token_text, start + 1)
        pieces, last = [], 0
        for cut in sorted(cuts):
            pieces += [text[last:cut], mark]
            last = cut
        return "".join(pieces) + text[last:]

    def _candidates(self, text: str, parse_special: bool) -> Iterator[int]:
        # A token can only occur if its first two characters do; checking that set first keeps
        # Gemma's ~6k control tokens from costing a substring search each.
        pairs = {text[i : i + 2] for i in range(len(text) - 1)}
        for token_id in self.special_ids:
            if not parse_special and self.attrs[token_id] & (ATTR_CONTROL | ATTR_UNKNOWN):
                continue
            token_text = self.tokens[token_id]
            if len(token_text) > 1 and token_text[:2] not in pairs:
                continue
            if token_text in text:
                yield token_id


def _split_fragments(fragments: Iterable[str | int], token_text: str, token_id: int) -> Iterator[str | int]:
    for fragment in fragments:
        if isinstance(fragment, int) or token_text not in fragment:
            yield fragment
            continue
        pieces = fragment.split(token_text)
        for i, piece in enumerate(pieces):
            if i:
                yield token_id
            if piece:
                yield piece


def load_vocabulary(metadata: dict[str, Any]) -> Vocabulary:
    """Build the vocabulary of a ``gpt2`` (BPE) or ``llama`` (SentencePiece) GGUF."""
    model = metadata.get(K.MODEL)
    if model not in ("gpt2", "llama"):
        raise TokenizerError(f"unsupported tokenizer model {model!r} (supported: 'gpt2', 'llama')")
    tokens = _token_texts(metadata)
    token_to_id = dict(zip(tokens, range(len(tokens)), strict=True))
    if len(token_to_id) != len(tokens):
        raise TokenizerError("duplicate token text in tokenizer.ggml.tokens")
    attrs = _token_attrs(metadata, len(tokens))
    special = _special_ids(metadata, model, len(tokens))
    _detect_named_tokens(special, token_to_id, attrs)
    eog_ids = _eog_ids(special, tokens, token_to_id, attrs)
    return Vocabulary(
        model=model,
        tokens=tokens,
        attrs=attrs,
        token_to_id=token_to_id,
        bos_id=special[K.BOS_ID],
        eos_id=special[K.EOS_ID],
        add_bos=_add_bos(metadata, model),
        add_space_prefix=bool(metadata.get(K.ADD_PREFIX, model == "llama")),
        eog_ids=eog_ids,
        special_ids=_special_order(tokens, attrs),
        scores=_scores(metadata, len(tokens)),
    )


def _token_texts(metadata: dict[str, Any]) -> list[str]:
    tokens = metadata.get(K.LIST)
    if not isinstance(tokens, list) or not tokens:
        raise TokenizerError("tokenizer.ggml.tokens is missing or empty")
    if "" in tokens:  # llama.cpp renames empty tokens rather than failing
        tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    return tokens


def _token_attrs(metadata: dict[str, Any], n_tokens: int) -> list[int]:
    types = metadata.get(K.TOKEN_TYPE)
    if types is None:
        return [ATTR_NORMAL] * n_tokens
    types = np.asarray(types, dtype=np.int64)[:n_tokens]
    if len(types) < n_tokens:
        raise TokenizerError("tokenizer.ggml.token_type is shorter than the vocabulary")
    in_range = (types >= 0) & (types < len(_TYPE_TO_ATTR))
    return np.where(in_range, _TYPE_TO_ATTR[np.clip(types, 0, len(_TYPE_TO_ATTR) - 1)], 0).tolist()


def _scores(metadata: dict[str, Any], n_tokens: int) -> list[float]:
    scores = metadata.get(K.SCORES)
    if scores is None:
        return [0.0] * n_tokens
    # float32 -> Python float is exact, so score comparisons match llama.cpp's float ones
    return np.asarray(scores, dtype=np.float32)[:n_tokens].astype(np.float64).tolist()


def _special_ids(metadata: dict[str, Any], model: str, n_tokens: int) -> dict[str, int | None]:
    defaults = {K.BOS_ID: 1, K.EOS_ID: 2} if model == "llama" else {K.BOS_ID: 11, K.EOS_ID: 11}
    keys = (K.BOS_ID, K.EOS_ID, K.EOT_ID, K.EOM_ID, *FIM_NAMES)
    special: dict[str, int | None] = {}
    for key in keys:
        default = defaults.get(key)
        special[key] = default if default is not None and default < n_tokens else None
        value = metadata.get(key)
        if isinstance(value, (int, np.integer)) and 0 <= int(value) < n_tokens:
            special[key] = int(value)
    for old_key, key in _DEPRECATED_FIM_KEYS.items():
        value = metadata.get(old_key)
        if isinstance(value, (int, np.integer)) and 0 <= int(value) < n_tokens:
            special[key] = int(value)
    return special


def _lowest_id(names: Iterable[str], token_to_id: dict[str, int]) -> int | None:
    # llama.cpp takes whichever its hash map yields first; the lowest id is a deterministic pick
    found = [token_to_id[n] for n in names if n in token_to_id]
    return min(found) if found else None


def _detect_named_tokens(
    special: dict[str, int | None], token_to_id: dict[str, int], attrs: list[int]
) -> None:
    named = {K.EOT_ID: EOT_NAMES, K.EOM_ID: EOM_NAMES, **FIM_NAMES}
    for key, names in named.items():
        if special[key] is not None:
            continue
        special[key] = _lowest_id(names, token_to_id)
        if special[key] is not None:
            attrs[special[key]] |= ATTR_CONTROL


def _eog_ids(
    special: dict[str, int | None], tokens: list[str], token_to_id: dict[str, int], attrs: list[int]
) -> frozenset[int]:
    eog = {special[k] for k in (K.FIM_PAD_ID, K.FIM_REP_ID, K.FIM_SEP_ID) if special[k] is not None}
    for name in EOG_NAMES:
        if name in token_to_id:
            eog.add(token_to_id[name])
            attrs[token_to_id[name]] |= ATTR_CONTROL
    for name in ALWAYS_RENDERED:
        if name in token_to_id:
            attrs[token_to_id[name]] = ATTR_USER_DEFINED
    eog |= {special[k] for k in (K.EOS_ID, K.EOT_ID, K.EOM_ID) if special[k] is not None}
    texts = {tokens[i]: i for i in eog}
    # harmony / solar-open: "<|end|>" ends a message there, not the generation
    if "<|end|>" in texts and (
        ("<|return|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts))
        or (("<|call|>" in texts or "<|calls|>" in texts) and "<|flush|>" in texts)
    ):
        eog.discard(texts["<|end|>"])
        attrs[texts["<|end|>"]] = ATTR_USER_DEFINED
    if "<|tool_response>" in texts and "</s>" in texts:
        eog.discard(texts["</s>"])
        attrs[texts["</s>"]] = ATTR_NORMAL
    return frozenset(eog)


def _add_bos(metadata: dict[str, Any], model: str) -> bool:
    pre = metadata.get(K.PRE, "")
    default = model == "llama" or pre in LLAMA3_BOS_PRE
    value = metadata.get(K.ADD_BOS)
    return bool(value) if isinstance(value, (bool, np.bool_)) else default


# BPE pre-tokenizer names for which llama.cpp adds BOS by default
LLAMA3_BOS_PRE = frozenset(
    [
        "llama3",
        "llama-v3",
        "llama-bpe",
        "falcon3",
        "falcon-h1",
        "pixtral",
        "midm-2.0",
        "lfm2",
        "jina-v5-nano",
        "tekken",
        "chameleon",
    ]
)


def _special_order(tokens: list[str], attrs: list[int]) -> list[int]:
    ids = [i for i, a in enumerate(attrs) if a & SPECIAL_ATTRS]
    ids.sort(key=lambda i: (-len(tokens[i].encode("utf-8")), i))
    return ids
