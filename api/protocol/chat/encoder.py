"""OpenAI Chat Completions: the chat.completion object and the chat.completion.chunk payloads."""

from __future__ import annotations

import time
import uuid

from inference.types import FinishReason, TokenLogprob, ToolCallDelta, Usage

from ..logprobs import token_entries


def logprobs_payload(records: tuple[TokenLogprob, ...] | None) -> dict | None:
    """A choice's ``logprobs``: None when the request did not ask for them."""
    if records is None:
        return None
    return {"content": token_entries(records), "refusal": None}


def usage_payload(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


class ChatEncoder:
    """Builds the chat.completion object or chat.completion.chunk payloads of one reply."""

    def __init__(self, model_id: str):
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model_id
        self._role_sent = False

    def completion(
        self,
        text: str,
        reason: FinishReason,
        usage: Usage,
        reasoning: str = "",
        calls: tuple = (),
        logprobs: tuple[TokenLogprob, ...] | None = None,
    ) -> dict:
        """The chat.completion object; ``logprobs``: the content's tokens (None: not asked)."""
        message = {"role": "assistant", "content": text or (None if calls else ""), "refusal": None}
        if calls:
            message["tool_calls"] = [self._tool_call(call) for call in calls]
        if reasoning:
            message["reasoning_content"] = reasoning
        choice = {
            "index": 0,
            "message": message,
            "logprobs": logprobs_payload(logprobs),
            "finish_reason": reason,
        }
        return self._envelope("chat.completion", [choice], usage=usage_payload(usage))

    def role_chunk(self) -> dict:
        """The chunk that opens a stream before any text: the role and empty content."""
        self._role_sent = True
        return self._chunk({"role": "assistant", "content": ""}, None)

    def delta_chunk(
        self, text: str, field: str = "content", logprobs: tuple[TokenLogprob, ...] | None = None
    ) -> dict:
        """A content (or reasoning_content) delta; the first one of the stream also carries
        the role. ``logprobs``: the tokens of a content delta, when the request asked."""
        delta = {field: text}
        if not self._role_sent:
            delta = {"role": "assistant", **delta}
            self._role_sent = True
        return self._chunk(delta, None, logprobs_payload(logprobs))

    def tool_call_chunk(self, delta: ToolCallDelta) -> dict:
        """A whole function call, sent as soon as it closed."""
        chunk = {"tool_calls": [{"index": delta.index, **self._tool_call(delta)}]}
        if not self._role_sent:
            chunk = {"role": "assistant", **chunk}
            self._role_sent = True
        return self._chunk(chunk, None)

    def _tool_call(self, delta: ToolCallDelta) -> dict:
        function = {"name": delta.call.name, "arguments": delta.call.arguments}
        return {"id": f"call_{self.id[-12:]}_{delta.index}", "type": "function", "function": function}

    def finish_chunk(self, reason: FinishReason) -> dict:
        return self._chunk({} if self._role_sent else {"role": "assistant", "content": ""}, reason)

    def usage_chunk(self, usage: Usage) -> dict:
        return self._envelope("chat.completion.chunk", [], usage=usage_payload(usage))

    def _chunk(self, delta: dict, reason: FinishReason | None, logprobs: dict | None = None) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        return self._envelope("chat.completion.chunk", [choice])

    def _envelope(self, kind: str, choices: list, **extra) -> dict:
        body = {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        body.update(extra)
        return body
