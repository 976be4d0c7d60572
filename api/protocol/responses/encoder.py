"""OpenAI Responses encoders: the event sequence of a streamed reply and the response object.

:class:`ResponsesEncoder` turns the worker's events into Responses stream events (each a dict
with ``type`` and a monotonic ``sequence_number``) and keeps the response object they build.
A non-streamed reply runs through the same machine and answers with its final object, so the
two shapes cannot drift apart. Reasoning (ReasoningDelta) is its own output item ahead of the
message; the message item is present, empty if the reply was, unless the reply made calls.
Each completed call (ToolCallDelta) closes the open item and becomes a ``function_call`` or
``custom_tool_call`` item after it (named as the client declared it, namespace included), its
arguments or input sent whole in one delta. When tool_choice forces a custom tool, the reply
text is that call's input, streamed as ``response.custom_tool_call_input.delta`` events. With
``include: ["message.output_text.logprobs"]`` the message's tokens are reported: each
output_text delta and done event carries its tokens, the output_text part all of them (OpenAI's
shapes: the events' entries without ``bytes``); otherwise every ``logprobs`` is ``[]``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from api.errors import ApiError
from inference.generation.toolcall import ToolCall
from inference.types import Finish, ReasoningDelta, TextDelta, TokenLogprob, ToolCallDelta, Usage

from ..logprobs import token_entries
from .request import ResponsesRequest
from .tools import ResponsesTool


def usage_payload(usage: Usage) -> dict:
    return {
        "input_tokens": usage.prompt_tokens,
        # Nothing is written to a cache the way OpenAI bills cache writes: always 0.
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def failure_code(error: ApiError) -> str:
    """A Response.error code (the Responses API's own vocabulary) for a failed reply."""
    if error.status == 429:
        return "rate_limit_exceeded"
    return "server_error" if error.status >= 500 else "invalid_prompt"


CALL_KINDS = ("function_call", "custom_tool_call")
ITEM_PREFIXES = {"function_call": "fc", "custom_tool_call": "ctc"}


@dataclass
class OutputItem:
    """One output item being built: a reasoning item, the assistant message or a call."""

    kind: str  # "reasoning" | "message" | "function_call" | "custom_tool_call"
    id: str
    index: int
    parts: list[str] = field(default_factory=list)
    status: str = "in_progress"
    call: ToolCall | None = None  # a call item's call (None: a forced custom call's streamed input)
    tool: ResponsesTool | None = None  # the declared tool it calls (None: not declared)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # the message text's tokens

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def part(self, text: str, logprobs: list[TokenLogprob] = ()) -> dict:
        if self.kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": token_entries(logprobs)}

    def payload(self, with_content: bool = True) -> dict:
        item = {"id": self.id, "type": self.kind, "status": self.status}
        if self.kind in CALL_KINDS:
            return {**item, "call_id": f"call_{self.id[3:27]}", **self._call_fields(with_content)}
        content = [self.part(self.text, self.logprobs)] if with_content else []
        if self.kind == "reasoning":
            return {**item, "summary": [], "content": content}
        return {**item, "role": "assistant", "content": content}

    def _call_fields(self, with_content: bool) -> dict:
        if self.tool is None:  # a name the request did not declare (models invent them)
            return {"name": self.call.name, "arguments": self.call.arguments if with_content else ""}
        if not with_content:
            return self.tool.call_fields("")
        # A forced custom call has no captured call: its input is the streamed reply text.
        return self.tool.call_fields(self.text if self.call is None else self.tool.content_of(self.call))


class ResponsesEncoder:
    """The Responses event sequence of one reply, and the response object it builds."""

    def __init__(self, model_id: str, request: ResponsesRequest):
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.model = model_id
        self.request = request
        self.items: list[OutputItem] = []
        self.response: dict = self._response("in_progress")
        self._sequence = 0

    @property
    def final(self) -> dict:
        """The response object as it stands (complete after ``finish``)."""
        return self.response

    # -- the stream ------------------------------------------------------------------------
    def start(self) -> list[dict]:
        return [
            self._event("response.created", response=self.response),
            self._event("response.in_progress", response=self.response),
        ]

    def keepalive(self) -> list[dict]:
        """While the reply waits: ``response.in_progress`` again, a lifecycle event every
        Responses reader takes (Codex CLI's idle timeout counts events, not SSE comments)."""
        return [self._event("response.in_progress", response=self._response("in_progress"))]

    def delta(self, event: TextDelta | ReasoningDelta | ToolCallDelta) -> list[dict]:
        if isinstance(event, ToolCallDelta):
            return self._call(event.call)
        if isinstance(event, TextDelta) and self.request.forced_custom is not None:
            return self._custom_input(event.text)
        kind = "reasoning" if isinstance(event, ReasoningDelta) else "message"
        events = self._switch_to(kind)
        item = self.items[-1]
        item.parts.append(event.text)
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {}
        if kind == "message":
            item.logprobs += event.logprobs
            extra = {"logprobs": token_entries(event.logprobs, with_bytes=False)}
        events.append(self._event(name, **self._where(item), delta=event.text, **extra))
        return events

    def finish(self, finish: Finish) -> list[dict]:
        """Close the open items and end with response.completed (or .incomplete on the budget)."""
        complete = finish.reason != "length"
        answered = any(item.kind == "message" or item.kind in CALL_KINDS for item in self.items)
        events = [] if answered else self._first_answer()
        events += self._close(self.items[-1], "completed" if complete else "incomplete")
        status = "completed" if complete else "incomplete"
        details = None if complete else {"reason": "max_output_tokens"}
        self.response = self._response(status, usage=usage_payload(finish.usage), incomplete_details=details)
        events.append(self._event(f"response.{status}", response=self.response))
        return events

    def fail(self, error: ApiError) -> list[dict]:
        """An ``error`` event, then response.failed with whatever output was produced."""
        for item in self.items:
            if item.status == "in_progress":
                item.status = "incomplete"
        events = [
            self._event("error", code=error.code, message=error.message, param=error.param),
        ]
        failed = {"code": failure_code(error), "message": error.message}
        self.response = self._response("failed", error=failed)
        events.append(self._event("response.failed", response=self.response))
        return events

    # -- items -----------------------------------------------------------------------------
    def _first_answer(self) -> list[dict]:
        """The item an empty reply still has: the message, or a forced custom call's."""
        if self.request.forced_custom is not None:
            return self._custom_input("")
        return self._switch_to("message")

    def _call(self, call: ToolCall) -> list[dict]:
        """Close the open item, then the whole call item (a reply that is only calls has no
        message item, as with OpenAI's)."""
        events = self._close(self.items[-1], "completed") if self.items else []
        tool = self.request.declared_tools.by_model_name(call.name)
        kind = tool.item_type if tool is not None else "function_call"
        item = OutputItem(
            kind, f"{ITEM_PREFIXES[kind]}_{uuid.uuid4().hex}", len(self.items), call=call, tool=tool
        )
        self.items.append(item)
        where = {"item_id": item.id, "output_index": item.index}
        events.append(
            self._event("response.output_item.added", output_index=item.index, item=item.payload(False))
        )
        item.status = "completed"
        payload = item.payload()
        if kind == "custom_tool_call":
            text = payload["input"]
            streamed = [
                self._event("response.custom_tool_call_input.delta", **where, delta=text),
                self._event("response.custom_tool_call_input.done", **where, input=text),
            ]
        else:
            arguments = payload["arguments"]
            streamed = [
                self._event("response.function_call_arguments.delta", **where, delta=arguments),
                self._event(
                    "response.function_call_arguments.done",
                    **where,
                    name=payload["name"],
                    arguments=arguments,
                ),
            ]
        return [
            *events,
            *streamed,
            self._event("response.output_item.done", output_index=item.index, item=payload),
        ]

    def _custom_input(self, text: str) -> list[dict]:
        """A forced custom tool's input as it streams (one call item, opened by the first text)."""
        events = []
        current = self.items[-1] if self.items else None
        if current is None or current.kind != "custom_tool_call" or current.status != "in_progress":
            if current is not None:
                events += self._close(current, "completed")
            tool = self.request.forced_custom
            item = OutputItem(tool.item_type, f"ctc_{uuid.uuid4().hex}", len(self.items), tool=tool)
            self.items.append(item)
            events.append(
                self._event("response.output_item.added", output_index=item.index, item=item.payload(False))
            )
        item = self.items[-1]
        item.parts.append(text)
        if text:
            where = {"item_id": item.id, "output_index": item.index}
            events.append(self._event("response.custom_tool_call_input.delta", **where, delta=text))
        return events

    def _switch_to(self, kind: str) -> list[dict]:
        """Make an open item of ``kind`` the last one, closing the one before it."""
        current = self.items[-1] if self.items else None
        if current is not None and current.kind == kind and current.status == "in_progress":
            return []
        events = self._close(current, "completed") if current is not None else []
        prefix = "rs" if kind == "reasoning" else "msg"
        item = OutputItem(kind, f"{prefix}_{uuid.uuid4().hex}", len(self.items))
        self.items.append(item)
        events.append(
            self._event("response.output_item.added", output_index=item.index, item=item.payload(False))
        )
        events.append(self._event("response.content_part.added", **self._where(item), part=item.part("")))
        return events

    def _close(self, item: OutputItem, status: str) -> list[dict]:
        if item.status != "in_progress":
            return []
        item.status = status
        if item.kind == "custom_tool_call":  # a forced custom call's streamed input
            where = {"item_id": item.id, "output_index": item.index}
            return [
                self._event("response.custom_tool_call_input.done", **where, input=item.text),
                self._event("response.output_item.done", output_index=item.index, item=item.payload()),
            ]
        done = "response.reasoning_text.done" if item.kind == "reasoning" else "response.output_text.done"
        extra = (
            {} if item.kind == "reasoning" else {"logprobs": token_entries(item.logprobs, with_bytes=False)}
        )
        return [
            self._event(done, **self._where(item), text=item.text, **extra),
            self._event(
                "response.content_part.done", **self._where(item), part=item.part(item.text, item.logprobs)
            ),
            self._event("response.output_item.done", output_index=item.index, item=item.payload()),
        ]

    @staticmethod
    def _where(item: OutputItem) -> dict:
        return {"item_id": item.id, "output_index": item.index, "content_index": 0}

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    # -- the response object ---------------------------------------------------------------
    def _response(self, status: str, usage=None, error=None, incomplete_details=None) -> dict:
        request = self.request
        done = status not in ("in_progress", "queued")
        response = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": incomplete_details,
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "max_tool_calls": None,
            "model": self.model,
            "output": [item.payload() for item in self.items] if done else [],
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": request.reasoning_effort, "summary": None},
            "store": False,
            "temperature": request.temperature,
            "text": {"format": request.text_format or {"type": "text"}},
            "tool_choice": request.tool_choice,
            "tools": list(request.declared_tools.echo),
            "top_logprobs": request.top_logprobs,
            "top_p": request.top_p,
            "truncation": "disabled",
            "metadata": {},
        }
        if usage is not None:  # the published schema has no null usage: absent until known
            response["usage"] = usage
        return response
