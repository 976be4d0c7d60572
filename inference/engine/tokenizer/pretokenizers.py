"""Word splitting before BPE, reproducing llama.cpp's ``unicode_regex_split``.

llama.cpp does not run the HF pre-tokenizer regexes on Unicode text. It first "collapses" the
text: every ASCII character stays itself, every other code point becomes one stand-in byte
for its Unicode category (letter, number, punctuation, mark, symbol, anything else) or a
vertical tab if it is Unicode White_Space. Its regexes have ``\\p{X}`` replaced by a class of
the stand-in plus the ASCII members of that category and run with ASCII ``\\s``. Doing the
same here, with Python's ``re`` on the collapsed text, makes the word boundaries identical
(including llama.cpp's view of which characters are letters). Each pre-tokenizer is a list of
regexes applied in turn; text between matches stays a word of its own, and a later regex only
splits within the words of the earlier one.

llama.cpp hand-codes the GPT-2 and Llama-3 regexes (``unicode_regex_split_custom_*``); those
loops give the same words as the regexes themselves on collapsed text, so one path serves all.
Categories come from ``unicodedata`` completed to Unicode 15.1, the version of llama.cpp's
tables (found by probing llama.cpp on every letter/number code point newer than Unicode 14).
"""

from __future__ import annotations

import bisect
import re
import unicodedata

from .vocab import TokenizerError

# Unicode White_Space (PropList.txt); Python's str.isspace() differs (it includes U+001C..U+001F).
WHITE_SPACE = frozenset(
    [
        *range(0x09, 0x0E),
        0x20,
        0x85,
        0xA0,
        0x1680,
        *range(0x2000, 0x200B),
        0x2028,
        0x2029,
        0x202F,
        0x205F,
        0x3000,
    ]
)
COLLAPSED_SPACE = "\x0b"
COLLAPSED_OTHER = "\xd0"
COLLAPSED_CATEGORY = {"N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5"}
# llama.cpp's tables are Unicode 15.1; Python 3.11's unicodedata is 14.0. The letters and
# numbers assigned in 15.0/15.1 (inclusive ranges) would otherwise look unassigned.
_UNICODE_15_LETTERS_NUMBERS = [
    (0x1123F, 0x11240, "L"),
    (0x11F02, 0x11F02, "L"),
    (0x11F04, 0x11F10, "L"),
    (0x11F12, 0x11F33, "L"),
    (0x11F50, 0x11F59, "N"),
    (0x1342F, 0x1342F, "L"),
    (0x13441, 0x13446, "L"),
    (0x1B132, 0x1B132, "L"),
    (0x1B155, 0x1B155, "L"),
    (0x1D2C0, 0x1D2D3, "N"),
    (0x1DF25, 0x1DF2A, "L"),
    (0x1E030, 0x1E06D, "L"),
    (0x1E4D0, 0x1E4EB, "L"),
    (0x1E4F0, 0x1E4F9, "N"),
    (0x2B739, 0x2B739, "L"),
    (0x2EBF0, 0x2EE5D, "L"),
    (0x31350, 0x323AF, "L"),
]
_UNICODE_15_STARTS = [start for start, _, _ in _UNICODE_15_LETTERS_NUMBERS]
# What replaces \p{X} inside a character class: the stand-in plus the ASCII members of X
_CLASS_BODY = {
    "N": "\xd1" + "0-9",
    "L": "\xd2" + "A-Za-z",
    "P": "\xd3" + r"!-#%-*,-/:-;?-@\[-\]_\{\}",
    "M": "\xd4",
    "S": "\xd5" + r"\$\+<->\^`\|",
}
_PROPERTY = re.compile(r"\\p\{(L[ultmo]?|N|P|M|S)\}")

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS_ANY_CASE = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
LLAMA3 = (
    _CONTRACTIONS_ANY_CASE
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2 = (
    _CONTRACTIONS_ANY_CASE
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Inkling (llama.cpp PR #25731's LLAMA_VOCAB_PRE_TYPE_INKLING): o200k's regex with \p{M} added to
# both word classes, so combining marks attach to the letters they follow.
_O200K_UPPER = r"((?=[\p{L}\p{M}])([^a-z]))"
_O200K_LOWER = r"((?=[\p{L}\p{M}])([^A-Z]))"
_O200K_SUFFIX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
INKLING = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_O200K_UPPER}*{_O200K_LOWER}+{_O200K_SUFFIX}"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_O200K_UPPER}+{_O200K_LOWER}*{_O200K_SUFFIX}"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3.5: Qwen2's words with combining marks (\p{M}) counted as letters.
QWEN35 = (
    _CONTRACTIONS_ANY_CASE
    + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]

# tokenizer.ggml.pre values, grouped as llama.cpp's llm_tokenizer_bpe groups them
_LLAMA3_NAMES = (
    "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano dbrx smaug-bpe"
)
_QWEN2_NAMES = "qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan grok-2 solar-open"
_SMOLLM_NAMES = "smollm starcoder refact command-r codeshell exaone minerva-7b mellum2"
_GPT2_NAMES = (
    "gpt-2 gpt2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert exaone4"
    " mpt olmo jais trillion granite-docling jina-v1-en jina-v2-code roberta-bpe"
)
PRE_REGEXES: dict[str, list[str]] = {
    **dict.fromkeys(_LLAMA3_NAMES.split(), [LLAMA3]),
    **dict.fromkeys(_QWEN2_NAMES.split(), [QWEN2]),
    "qwen35": [QWEN35],
    **dict.fromkeys(_SMOLLM_NAMES.split(), [r"\p{N}", GPT2]),
    **dict.fromkeys(_GPT2_NAMES.split(), [GPT2]),
    "inkling": [INKLING],
    "default": DEFAULT,
    "": DEFAULT,
}
# pre types whose words are looked up whole in the vocabulary before merging
IGNORE_MERGES_PRE = frozenset(
    ["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"]
)


class _CollapseTable(dict):
    """``str.translate`` table mapping a code point to its stand-in, filled on first use."""

    def __missing__(self, code_point: int) -> str:
        if code_point in WHITE_SPACE:
            stand_in = COLLAPSED_SPACE
        else:
            stand_in = COLLAPSED_CATEGORY.get(_major_category(code_point), COLLAPSED_OTHER)
        self[code_point] = stand_in
        return stand_in


def _major_category(code_point: int) -> str:
    """First letter of the general category, as of Unicode 15.1 for letters and numbers."""
    category = unicodedata.category(chr(code_point))[0]
    if category == "C":
        i = bisect.bisect_right(_UNICODE_15_STARTS, code_point) - 1
        if i >= 0 and code_point <= _UNICODE_15_LETTERS_NUMBERS[i][1]:
            return _UNICODE_15_LETTERS_NUMBERS[i][2]
    return category


_COLLAPSE = _CollapseTable({c: chr(c) for c in range(128)})


def collapse(text: str) -> str:
    """The text as llama.cpp's regexes see it (same length, one stand-in per code point)."""
    return text if text.isascii() else text.translate(_COLLAPSE)


def collapse_pattern(expr: str) -> str:
    """llama.cpp's regex with each ``\\p{X}`` rewritten for collapsed text."""
    out: list[str] = []
    inside_class = False
    i = 0
    while i < len(expr):
        ch = expr[i]
        if ch == "\\" and i + 1 < len(expr) and expr[i + 1] != "p":
            out.append(expr[i : i + 2])  # an escape is never a class boundary
            i += 2
            continue
        match = _PROPERTY.match(expr, i)
        if match:
            body = _CLASS_BODY[match.group(1)[0]]
            out.append(body if inside_class else f"[{body}]")
            i = match.end()
            continue
        if ch == "[":
            inside_class = True
        elif ch == "]" and inside_class:
            inside_class = False
        out.append(ch)
        i += 1
    return "".join(out)


class PreTokenizer:
    """Splits text into the words BPE merges within, for one ``tokenizer.ggml.pre`` value."""

    def __init__(self, pre: str):
        if pre not in PRE_REGEXES:
            raise TokenizerError(f"unsupported BPE pre-tokenizer {pre!r}")
        self.pre = pre
        self.ignore_merges = pre in IGNORE_MERGES_PRE
        self._patterns = [re.compile(collapse_pattern(e), re.ASCII) for e in PRE_REGEXES[pre]]

    def split(self, text: str) -> list[str]:
        """The words of ``text``; joined back together they give ``text``."""
        collapsed = collapse(text)
        spans = [(0, len(text))]
        for pattern in self._patterns:
            spans = _split_spans(pattern, collapsed, spans)
        return [text[start:end] for start, end in spans]


def _split_spans(pattern: re.Pattern, collapsed: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in spans:
        pos = start
        # endpos makes lookaheads see the span's end as the end of text, as llama.cpp's
        # per-span regex iterator does
        for match in pattern.finditer(collapsed, start, end):
            m_start, m_end = match.span()
            if m_start > pos:
                out.append((pos, m_start))
            if m_end > m_start:
                out.append((m_start, m_end))
            pos = m_end
        if pos < end:
            out.append((pos, end))
    return out
