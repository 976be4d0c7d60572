"""OpenAI Responses encoders: the event sequence of a streamed reply and the response object.

:class:`ResponsesEncoder` turns the worker's events into Responses stream events (each a dict
with ``type`` and a monotonic ``sequence_number``) and keeps the response object they build.
A non-streamed reply runs through the same machine and answers with its final object, so the
two shapes cannot drift apart. Reasoning (ReasoningDelta) is its own output item ahead of the
message; the message item is present, empty if the reply was, unless the reply made calls.
Each completed function call (ToolCallDelta) closes the open item and becomes a
``function_call`` item after it, its arguments sent whole in one delta. With ``include:
["message.output_text.logprobs"]`` the message's tokens are reported: each output_text delta
and done event carries its tokens, the output_text part all of them (OpenAI's shapes: the
events' entries without ``bytes``); otherwise every ``logprobs`` is ``[]``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from api.errors import ApiError
from inference.types import Finish, ReasoningDelta, TextDelta, TokenLogprob, ToolCallDelta, Usage

from ..logprobs import token_entries
from .request import ResponsesRequest
from .tools import tools_echo


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


@dataclass
class OutputItem:
    """One output item being built: a reasoning item, the assistant message or a function call."""

    kind: str  # "reasoning" | "message" | "function_call"
    id: str
    index: int
    parts: list[str] = field(default_factory=list)
    status: str = "in_progress"
    call: ToolCallDelta | None = None  # the function_call item's call
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
        if self.kind == "function_call":
            arguments = self.call.call.arguments if with_content else ""
            call_id = f"call_{self.id[3:27]}"
            return {**item, "call_id": call_id, "name": self.call.call.name, "arguments": arguments}
        content = [self.part(self.text, self.logprobs)] if with_content else []
        if self.kind == "reasoning":
            return {**item, "summary": [], "content": content}
        return {**item, "role": "assistant", "content": content}


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

    def delta(self, event: TextDelta | ReasoningDelta | ToolCallDelta) -> list[dict]:
        if isinstance(event, ToolCallDelta):
            return self._function_call(event)
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
        answered = any(item.kind in ("message", "function_call") for item in self.items)
        events = [] if answered else self._switch_to("message")
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
    def _function_call(self, event: ToolCallDelta) -> list[dict]:
        """Close the open item, then the whole function_call item (a reply that is only calls
        has no message item, as with OpenAI's)."""
        events = self._close(self.items[-1], "completed") if self.items else []
        item = OutputItem("function_call", f"fc_{uuid.uuid4().hex}", len(self.items), call=event)
        self.items.append(item)
        where = {"item_id": item.id, "output_index": item.index}
        arguments = event.call.arguments
        events.append(
            self._event("response.output_item.added", output_index=item.index, item=item.payload(False))
        )
        item.status = "completed"
        return [
            *events,
            self._event("response.function_call_arguments.delta", **where, delta=arguments),
            self._event(
                "response.function_call_arguments.done", **where, name=event.call.name, arguments=arguments
            ),
            self._event("response.output_item.done", output_index=item.index, item=item.payload()),
        ]

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
            "tools": tools_echo(request.declared_tools),
            "top_logprobs": request.top_logprobs,
            "top_p": request.top_p,
            "truncation": "disabled",
            "metadata": {},
        }
        if usage is not None:  # the published schema has no null usage: absent until known
            response["usage"] = usage
        return response
