"""OpenAI (legacy) Completions: the text_completion object and its stream chunks."""

from __future__ import annotations

import time
import uuid

from api.protocol.chat.encoder import usage_payload
from api.protocol.logprobs import legacy_logprobs
from inference.types import FinishReason, TokenLogprob, Usage


class CompletionsEncoder:
    """Builds the text_completion object, or the text_completion chunks of a stream, of one
    reply (one choice, index 0; ``logprobs`` null unless asked for: then the legacy parallel
    lists, each chunk's for its own tokens)."""

    def __init__(self, model_id: str):
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model_id

    def completion(
        self,
        text: str,
        reason: FinishReason,
        usage: Usage,
        logprobs: tuple[TokenLogprob, ...] | None = None,
        offset: int = 0,
    ) -> dict:
        """The whole reply; ``logprobs`` its tokens' (None: not asked), ``offset`` the length
        of the text before them (an echoed prompt)."""
        return self._envelope([self._choice(text, reason, logprobs, offset)], usage=usage_payload(usage))

    def chunk(
        self,
        text: str,
        reason: FinishReason | None = None,
        logprobs: tuple[TokenLogprob, ...] | None = None,
        offset: int = 0,
    ) -> dict:
        """A piece of the reply text (the last chunk: empty text and the finish reason)."""
        return self._envelope([self._choice(text, reason, logprobs, offset)])

    def usage_chunk(self, usage: Usage) -> dict:
        """The stream's last chunk with ``stream_options.include_usage``: no choices."""
        return self._envelope([], usage=usage_payload(usage))

    @staticmethod
    def _choice(text: str, reason: FinishReason | None, logprobs, offset: int) -> dict:
        reported = legacy_logprobs(logprobs, offset) if logprobs is not None else None
        return {"text": text, "index": 0, "logprobs": reported, "finish_reason": reason}

    def _envelope(self, choices: list, **extra) -> dict:
        body = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        body.update(extra)
        return body
