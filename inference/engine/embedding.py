"""The embedding contract shared by ``POST /v1/embeddings`` and the fleet index.

A text's embedding is taken after the text *and* a fixed question about it: the suffix steers
the last token's hidden state towards a summary of the topic (a prompt-based embedding, as in
PromptEOL). Text and suffix are tokenized separately and concatenated, so the suffix is the
same tokens whatever the text ends with; :meth:`Engine.embed` turns the tokens into the
vector. Fleet retrieval and the endpoint agree because both call :func:`embedding_tokens`.
"""

from __future__ import annotations

from .tokenizer import Tokenizer

EMBED_SUFFIX = "\nIn one word, the main topic of the text above is:"


def embedding_tokens(tokenizer: Tokenizer, text: str) -> list[int]:
    """The tokens whose embedding stands for ``text``: the text as plain text (a control
    token's spelling inside it stays text), BOS as the model's metadata says, then the suffix
    tokenized on its own."""
    head = tokenizer.encode(text, add_bos=tokenizer.add_bos, parse_special=False)
    return head + tokenizer.encode(EMBED_SUFFIX, add_bos=False, parse_special=False)
