"""How the OpenAI dialects write a token's log probability (TextDelta.logprobs entries).

Chat Completions (``choices[0].logprobs.content``) and a Responses ``output_text`` part share
one entry shape: ``{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
"bytes"}]}``; Responses' ``output_text.delta`` / ``.done`` events leave the bytes out, as
OpenAI's reference declares them. ``token`` is the token's text, lossy (U+FFFD) where its
bytes are not whole code points alone; ``bytes`` are its real bytes.
"""

from __future__ import annotations

from collections.abc import Iterable

from inference.types import TokenLogprob


def token_entry(record: TokenLogprob, with_bytes: bool = True) -> dict:
    """One reported token with its alternatives."""
    entry = _entry(record, with_bytes)
    entry["top_logprobs"] = [_entry(alternative, with_bytes) for alternative in record.top]
    return entry


def token_entries(records: Iterable[TokenLogprob], with_bytes: bool = True) -> list[dict]:
    return [token_entry(record, with_bytes) for record in records]


def _entry(record: TokenLogprob, with_bytes: bool) -> dict:
    entry = {"token": record.text, "logprob": record.logprob}
    if with_bytes:
        entry["bytes"] = list(record.data)
    return entry


def legacy_logprobs(records: Iterable[TokenLogprob], offset: int = 0) -> dict:
    """Legacy Completions' shape (``choices[0].logprobs``): parallel lists of the tokens, their
    log probabilities, one ``{token: logprob}`` object of alternatives per token, and each
    token's character offset in the choice's text (``offset``: the text before them, an
    echoed prompt)."""
    tokens, logprobs, tops, offsets = [], [], [], []
    for record in records:
        offsets.append(offset)
        tokens.append(record.text)
        logprobs.append(record.logprob)
        tops.append({alternative.text: alternative.logprob for alternative in record.top})
        offset += len(record.text)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}
