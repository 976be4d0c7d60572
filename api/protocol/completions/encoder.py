"""OpenAI (legacy) Completions: the text_completion object and its stream chunks."""

from __future__ import annotations

import time
import uuid

from api.protocol.chat.encoder import usage_payload
from inference.types import FinishReason, Usage


class CompletionsEncoder:
    """Builds the text_completion object, or the text_completion chunks of a stream, of one
    reply (one choice, index 0; ``logprobs`` is always null)."""

    def __init__(self, model_id: str):
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model_id

    def completion(self, text: str, reason: FinishReason, usage: Usage) -> dict:
        return self._envelope([self._choice(text, reason)], usage=usage_payload(usage))

    def chunk(self, text: str, reason: FinishReason | None = None) -> dict:
        """A piece of the reply text (the last chunk: empty text and the finish reason)."""
        return self._envelope([self._choice(text, reason)])

    def usage_chunk(self, usage: Usage) -> dict:
        """The stream's last chunk with ``stream_options.include_usage``: no choices."""
        return self._envelope([], usage=usage_payload(usage))

    @staticmethod
    def _choice(text: str, reason: FinishReason | None) -> dict:
        return {"text": text, "index": 0, "logprobs": None, "finish_reason": reason}

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
