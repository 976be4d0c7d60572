"""Anthropic Messages encoders: the event sequence of a streamed reply and the message object.

:class:`MessagesEncoder` turns the worker's events into Messages stream events (dicts with a
``type``) and keeps the message they build; a non-streamed reply runs through the same machine
and answers with its final message. Blocks come in the order the model produced them: a
thinking block (from ReasoningDelta, closed by an empty signature_delta, since there is no
signature to give), then the text block, then a ``tool_use`` block per completed call (its
input sent whole in one input_json_delta). The text block is present, empty if the reply was,
unless the reply made calls.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from api.errors import ApiError
from inference.types import Finish, ReasoningDelta, TextDelta, ToolCallDelta, Usage


def usage_payload(usage: Usage) -> dict:
    """Anthropic's accounting: ``input_tokens`` are the prompt tokens actually processed; the
    ones served from a resident KV cache are ``cache_read_input_tokens`` (the total prompt is
    their sum, as with Anthropic's prompt caching)."""
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
    }


ZERO_USAGE = usage_payload(Usage(0, 0))
# Seconds a stream may wait with pings alone before its keep-alive carries content events.
CONTENT_KEEPALIVE_AFTER = 120.0


def stop_fields(finish: Finish) -> tuple[str, str | None]:
    """``stop_reason`` and ``stop_sequence``, decided together so they never disagree: the
    sequence is given exactly when the reason is ``stop_sequence``."""
    if finish.reason == "length":
        return "max_tokens", None
    if finish.reason == "tool_calls":
        return "tool_use", None
    if finish.stop_sequence is not None:
        return "stop_sequence", finish.stop_sequence
    return "end_turn", None


@dataclass
class ContentBlock:
    """One content block being built: thinking, text or a tool_use call."""

    kind: str  # "thinking" | "text" | "tool_use"
    index: int
    parts: list[str] = field(default_factory=list)
    open: bool = True
    call: ToolCallDelta | None = None  # the tool_use block's call
    call_id: str = ""

    def payload(self, with_content: bool = True) -> dict:
        text = "".join(self.parts) if with_content else ""
        if self.kind == "tool_use":
            arguments = json.loads(self.call.call.arguments) if with_content else {}
            return {"type": "tool_use", "id": self.call_id, "name": self.call.call.name, "input": arguments}
        if self.kind == "thinking":
            return {"type": "thinking", "thinking": text, "signature": ""}
        return {"type": "text", "text": text}

    def delta(self, text: str) -> dict:
        if self.kind == "thinking":
            return {"type": "thinking_delta", "thinking": text}
        return {"type": "text_delta", "text": text}


class MessagesEncoder:
    """The Messages event sequence of one reply, and the message object it builds."""

    def __init__(self, model_id: str):
        self.id = f"msg_{uuid.uuid4().hex}"
        self.model = model_id
        self.blocks: list[ContentBlock] = []
        self.message = self._message(None, None, ZERO_USAGE)
        self.started = time.monotonic()

    @property
    def final(self) -> dict:
        """The message as it stands (complete after ``finish``)."""
        return self.message

    def start(self) -> list[dict]:
        """message_start: the skeleton, usage zeroed (the counts are known at the end)."""
        return [{"type": "message_start", "message": self._message(None, None, ZERO_USAGE, content=False)}]

    def keepalive(self) -> list[dict]:
        """While the reply waits: a ``ping``, which the SDKs skip. Claude Code turns bytes into
        heartbeats only for about five minutes and then aborts a stream that has sent no event
        its SDK yields, so a wait longer than :data:`CONTENT_KEEPALIVE_AFTER` seconds opens the
        text block early and adds an empty delta to it with each ping (a reply that turns out
        to be only calls then keeps an empty text block before them)."""
        events = [{"type": "ping"}]
        if time.monotonic() - self.started < CONTENT_KEEPALIVE_AFTER:
            return events
        current = self.blocks[-1] if self.blocks else None
        if current is None:
            events += self._switch_to("text")
            current = self.blocks[-1]
        if current.open and current.kind in ("text", "thinking"):
            events.append({"type": "content_block_delta", "index": current.index, "delta": current.delta("")})
        return events

    def delta(self, event: TextDelta | ReasoningDelta | ToolCallDelta) -> list[dict]:
        if isinstance(event, ToolCallDelta):
            return self._tool_use(event)
        events = self._switch_to("thinking" if isinstance(event, ReasoningDelta) else "text")
        block = self.blocks[-1]
        block.parts.append(event.text)
        events.append({"type": "content_block_delta", "index": block.index, "delta": block.delta(event.text)})
        return events

    def finish(self, finish: Finish) -> list[dict]:
        """Close the blocks, then message_delta (stop reason, full usage) and message_stop."""
        answered = any(block.kind in ("text", "tool_use") for block in self.blocks)
        events = [] if answered else self._switch_to("text")
        events += self._close(self.blocks[-1])
        (reason, sequence), usage = stop_fields(finish), usage_payload(finish.usage)
        self.message = self._message(reason, sequence, usage)
        events.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": usage,
            }
        )
        events.append({"type": "message_stop"})
        return events

    @staticmethod
    def fail(error: ApiError) -> list[dict]:
        """A mid-stream failure: one ``error`` event ends the stream."""
        return [error.anthropic_payload()]

    def _tool_use(self, event: ToolCallDelta) -> list[dict]:
        """Close the open block, then the whole tool_use block (a reply that is only calls has
        no text block, as with Anthropic's own forced tool use)."""
        events = self._close(self.blocks[-1]) if self.blocks else []
        block = ContentBlock("tool_use", len(self.blocks), call=event, open=False)
        block.call_id = f"toolu_{self.id[4:20]}{event.index:02d}"
        self.blocks.append(block)
        delta = {"type": "input_json_delta", "partial_json": event.call.arguments}
        return [
            *events,
            {"type": "content_block_start", "index": block.index, "content_block": block.payload(False)},
            {"type": "content_block_delta", "index": block.index, "delta": delta},
            {"type": "content_block_stop", "index": block.index},
        ]

    def _switch_to(self, kind: str) -> list[dict]:
        """Make an open block of ``kind`` the last one, closing the one before it."""
        current = self.blocks[-1] if self.blocks else None
        if current is not None and current.kind == kind and current.open:
            return []
        events = self._close(current) if current is not None else []
        block = ContentBlock(kind, len(self.blocks))
        self.blocks.append(block)
        start = {"type": "content_block_start", "index": block.index, "content_block": block.payload(False)}
        events.append(start)
        return events

    @staticmethod
    def _close(block: ContentBlock) -> list[dict]:
        if not block.open:
            return []
        block.open = False
        events = []
        if block.kind == "thinking":
            signature = {"type": "signature_delta", "signature": ""}
            events.append({"type": "content_block_delta", "index": block.index, "delta": signature})
        events.append({"type": "content_block_stop", "index": block.index})
        return events

    def _message(self, reason: str | None, stop: str | None, usage: dict, content: bool = True) -> dict:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [block.payload() for block in self.blocks] if content else [],
            "stop_reason": reason,
            "stop_sequence": stop,
            "usage": usage,
        }
