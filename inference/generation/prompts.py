"""Raw prompts (legacy completions, /infill): the tokens of a prompt sent as is, and the
fill-in-the-middle prompt built from the FIM tokens of the model's vocabulary, as llama.cpp's
server builds them (``format_infill`` in tools/server/utils.hpp).

Connection side and Django-free: the tokenizer is only read.
"""

from __future__ import annotations

from functools import lru_cache

import gguf
import numpy as np

from inference.engine.engine import Engine
from inference.engine.tokenizer import Tokenizer
from inference.engine.tokenizer.vocab import FIM_NAMES
from inference.types import Error, FillInMiddle, RawPrompt

K = gguf.Keys.Tokenizer
# The FIM keys of older GGUF files, read as llama.cpp reads them.
OLD_FIM_KEYS = {K.PREFIX_ID: K.FIM_PRE_ID, K.SUFFIX_ID: K.FIM_SUF_ID, K.MIDDLE_ID: K.FIM_MID_ID}

# llama.cpp sizes /infill's prefix and suffix by its default --batch-size: the prefix keeps
# its last 3/4 of a batch, the suffix what is left of the last quarter.
FIM_BATCH = 2048
# The repository name llama.cpp writes after <|repo_name|> (it takes none from the request).
FIM_REPOSITORY = "myproject\n"
# The current file's name after the last <|file_sep|> (llama.cpp's placeholder).
FIM_CURRENT_FILE = "filename\n"
# Between extra files when the vocabulary has no file separator: "\n\n--- snippet ---\n\n".
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"
FIM_REQUIRED = ("pre", "suf", "mid")


@lru_cache(maxsize=4)
def fim_token_ids(engine: Engine) -> dict[str, int | None]:
    """The model's fill-in-the-middle tokens, "pre", "suf", "mid", "pad", "rep", "sep" -> id
    (None when absent), found as llama.cpp's vocabulary loader finds them: the GGUF key
    (``tokenizer.ggml.fim_pre_token_id``, or its older name), else the lowest id among the
    token texts it knows (``<|fim_prefix|>``, ``<fim-prefix>``, ``<PRE>``...)."""
    return fim_ids_from(engine.file.metadata, engine.tokenizer)


def fim_ids_from(metadata: dict, tokenizer: Tokenizer) -> dict[str, int | None]:
    """``fim_token_ids`` of a GGUF's metadata and its tokenizer."""
    found: dict[str, int | None] = {}
    for key, names in FIM_NAMES.items():
        value = metadata.get(key)
        for old, new in OLD_FIM_KEYS.items():
            if new == key and metadata.get(old) is not None:
                value = metadata.get(old)
        value = int(value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else None
        if value is None or not 0 <= value < tokenizer.vocab_size:
            ids = [tokenizer.token_id(name) for name in names]
            value = min((i for i in ids if i is not None), default=None)
        found[key.split(".")[-1].split("_")[1]] = value  # tokenizer.ggml.fim_pre_token_id -> "pre"
    return found


def raw_prompt_tokens(
    engine: Engine, raw: RawPrompt, n_ctx: int, max_tokens: int | None
) -> list[int] | Error:
    """The tokens of ``raw``: its text with special-token texts parsed and BOS as the model's
    metadata says, or its token ids as sent (each checked against the vocabulary), or the FIM
    prompt around them. ``n_ctx`` and ``max_tokens`` size the repository context of /infill."""
    tokenizer = engine.tokenizer
    if raw.tokens is not None:
        outside = [t for t in raw.tokens if not 0 <= t < tokenizer.vocab_size]
        if outside:
            return Error(
                400,
                f"Invalid value for '{raw.param}': token ids {outside[:8]} are outside the vocabulary "
                f"(0..{tokenizer.vocab_size - 1})",
                code="invalid_value",
                param=raw.param,
            )
    if raw.fim is not None:
        tokens = fim_tokens(tokenizer, fim_token_ids(engine), raw, n_ctx, max_tokens)
    elif raw.tokens is not None:
        tokens = list(raw.tokens)
    else:
        tokens = tokenizer.encode(raw.text, add_bos=tokenizer.add_bos, parse_special=True)
    if isinstance(tokens, list) and not tokens:
        return Error(
            400,
            f"'{raw.param}' is empty: there is nothing to continue",
            code="invalid_value",
            param=raw.param,
        )
    return tokens


def fim_unavailable(ids: dict[str, int | None], fim: FillInMiddle) -> Error | None:
    """A 400 naming the FIM field when the vocabulary lacks the prefix/suffix/middle tokens."""
    missing = [name for name in FIM_REQUIRED if ids.get(name) is None]
    if not missing:
        return None
    return Error(
        400,
        f"'{fim.param}' needs a model whose vocabulary has fill-in-the-middle tokens "
        "(<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|> or their kin); this one has none",
        code="unsupported_parameter",
        param=fim.param,
    )


def fim_tokens(
    tokenizer: Tokenizer, ids: dict[str, int | None], raw: RawPrompt, n_ctx: int, max_tokens: int | None
) -> list[int] | Error:
    """``[extra files][BOS][FIM_PRE]prefix after_prefix[FIM_SUF]suffix[FIM_MID]``.

    Prefix, suffix and the files are plain text (a control token's text in code stays text);
    ``after_prefix`` (llama.cpp's /infill ``prompt``) has its special-token texts parsed. In the
    repository pattern the files follow ``<|repo_name|>myproject`` and each its
    ``<|file_sep|>name``, the current file is announced last, and prefix, suffix and files are
    cut as llama.cpp cuts them (the prefix keeps its end, the suffix its start, the files what
    fits the context beside two reply budgets)."""
    fim = raw.fim
    refused = fim_unavailable(ids, fim)
    if refused is not None:
        return refused

    def plain(text: str) -> list[int]:
        return tokenizer.encode(text, add_bos=False, parse_special=False)

    prefix = list(raw.tokens) if raw.tokens is not None else plain(raw.text)
    suffix = plain(fim.suffix)
    after_prefix = tokenizer.encode(fim.after_prefix, add_bos=False, parse_special=True)
    extra: list[int] = []
    if fim.repository:
        if ids.get("rep") is not None:
            extra += [ids["rep"], *plain(FIM_REPOSITORY)]
        for context in fim.extra:
            if ids.get("sep") is not None:
                extra += [ids["sep"], *plain(context.filename + "\n")]
            else:
                extra += plain(SNIPPET_SEPARATOR)
            extra += plain(context.text)
        if ids.get("sep") is not None:
            extra += [ids["sep"], *plain(FIM_CURRENT_FILE)]
        prefix_take = min(len(prefix), 3 * (FIM_BATCH // 4))
        suffix_take = min(len(suffix), max(0, FIM_BATCH // 4 - (2 + len(after_prefix))))
        n_predict = max_tokens if max_tokens is not None else -1  # llama.cpp: -1, no limit
        extra_take = min(max(0, n_ctx - FIM_BATCH - 2 * n_predict), len(extra))
        prefix = prefix[len(prefix) - prefix_take :]
        suffix = suffix[:suffix_take]
        extra = extra[len(extra) - extra_take :]
    bos = [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else []
    return [*extra, *bos, ids["pre"], *prefix, *after_prefix, ids["suf"], *suffix, ids["mid"]]
