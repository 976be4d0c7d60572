"""OpenAI Chat Completions: request validation, and the response and chunk encoders.

``ChatCompletionRequest.parse`` turns a JSON object into a validated request or an ApiError
(a value, never an exception). Honored fields map onto the dialect-free GenerationRequest;
fields this server cannot honor are refused by name (400, or 501 for ones a later version
implements) instead of being silently dropped; bookkeeping fields (metadata, user, store,
service_tier, parallel_tool_calls, ...) and unknown fields are accepted and ignored.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from api.errors import ApiError, bad_request, unsupported
from inference.generation.constraints import ConstraintSpec
from inference.generation.toolcall import ToolSpec
from inference.types import FinishReason, GenerationRequest, Message, ToolCallDelta, Usage

from . import fields as f
from .fields import Invalid
from .formats import one_constraint, parse_extensions, parse_format
from .tools import parse_chat_tool_choice, parse_chat_tools, parse_tool_calls

MAX_STOP_STRINGS = 4
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
CHAT_TEXT_KEYS = {"text": "text", "refusal": "refusal"}
REFUSED_PART_TYPES = {
    "image_url": "image input",
    "input_image": "image input",
    "input_audio": "audio input",
    "audio": "audio input",
    "file": "file input",
    "input_file": "file input",
}
REASONING_OFF = (None, "none", "minimal")  # reasoning is off by default: these are honored as-is
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


@dataclass(frozen=True)
class ChatCompletionRequest:
    """A validated request; fields in the order of OpenAI's reference, then our extensions."""

    messages: tuple[Message, ...]
    model: str | None = None  # accepted and ignored: one process serves one model
    frequency_penalty: float | None = None
    max_completion_tokens: int | None = None
    max_tokens: int | None = None
    presence_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage
    temperature: float | None = None
    top_p: float | None = None
    # Extensions with llama.cpp precedent.
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    ignore_eos: bool = False
    # response_format json_object / json_schema, or the regex / lark extensions.
    constraint: ConstraintSpec | None = None
    reasoning_effort: str | None = None
    tools: tuple[ToolSpec, ...] = ()  # as the model sees them (none under tool_choice "none")
    # The first field that needs a function-calling convention (tools, or a tool history:
    # an assistant's tool_calls, a role "tool" message), whatever tool_choice says.
    tools_param: str | None = None

    @classmethod
    def parse(cls, body: dict) -> ChatCompletionRequest | ApiError:
        """Validate a decoded JSON object; the first problem found is returned as an ApiError."""
        try:
            _refuse_unsupported(body)
            tools, forced = parse_chat_tool_choice(body, parse_chat_tools(body))
            messages = parse_messages(body.get("messages"))
            return cls(
                tools=tools,
                tools_param="tools" if f.array(body, "tools") else _tool_history_param(messages),
                messages=messages,
                model=f.string(body, "model"),
                frequency_penalty=f.number(body, "frequency_penalty", -2.0, 2.0),
                max_completion_tokens=f.integer(body, "max_completion_tokens", lo=1),
                max_tokens=f.integer(body, "max_tokens", lo=1),
                presence_penalty=f.number(body, "presence_penalty", -2.0, 2.0),
                seed=f.integer(body, "seed"),
                stop=parse_stop(body.get("stop")),
                stream=bool(f.boolean(body, "stream")),
                include_usage=_parse_stream_options(body),
                temperature=f.number(body, "temperature", 0.0, 2.0),
                top_p=f.number(body, "top_p", 0.0, 1.0),
                top_k=f.integer(body, "top_k", lo=0),
                min_p=f.number(body, "min_p", 0.0, 1.0),
                repeat_penalty=f.number(body, "repeat_penalty", 0.0, 10.0, lo_open=True),
                ignore_eos=bool(f.boolean(body, "ignore_eos")),
                reasoning_effort=_parse_effort(body),
                constraint=one_constraint(
                    parse_format(body.get("response_format"), "response_format"),
                    parse_extensions(body),
                    forced,
                ),
            )
        except Invalid as exc:
            return exc.error

    def to_generation(
        self, reasoning_available: bool, tools_available: bool = False
    ) -> GenerationRequest | ApiError:
        """The dialect-free request the worker serves; reasoning needs a model with a
        reasoning channel (and a constrained reply never reasons), tools a model with a
        function-calling convention."""
        if self.tools_param is not None and not tools_available:
            return unsupported(
                self.tools_param, "needs a model with a function-calling convention; this one has none"
            )
        wants_reasoning = self.reasoning_effort not in REASONING_OFF
        if wants_reasoning and not reasoning_available:
            return unsupported(
                "reasoning_effort",
                f"{self.reasoning_effort!r} needs a model with a reasoning channel, and this one has "
                "none; use 'none' or 'minimal'",
            )
        budget = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return GenerationRequest(
            self.messages,
            f.sampling_overrides(self),
            budget,
            self.stop,
            self.ignore_eos,
            reasoning=wants_reasoning and self.constraint is None,
            constraint=self.constraint,
            tools=self.tools,
        )


# -- refused parameters ----------------------------------------------------------------------
def _refuse_unsupported(body: dict) -> None:
    n = f.integer(body, "n", lo=1)
    if n is not None and n > 1:
        raise Invalid(unsupported("n", "> 1 is not supported: this server returns one choice"))
    if f.boolean(body, "logprobs"):
        raise Invalid(unsupported("logprobs"))
    if f.integer(body, "top_logprobs", lo=0):  # 0 asks for nothing, as on Responses
        raise Invalid(unsupported("top_logprobs"))
    if f.obj(body, "logit_bias"):
        raise Invalid(unsupported("logit_bias"))
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise Invalid(unsupported(legacy, "belongs to the legacy functions API; use 'tools'"))
    if body.get("audio") is not None:
        raise Invalid(unsupported("audio", "is not supported: this server produces text only"))
    modalities = f.array(body, "modalities")
    if modalities and any(m != "text" for m in modalities):
        raise Invalid(unsupported("modalities", "other than ['text'] are not supported"))
    if body.get("web_search_options") is not None:
        raise Invalid(unsupported("web_search_options", "(a hosted tool) is not supported"))


# -- messages --------------------------------------------------------------------------------
def parse_messages(value: object) -> tuple[Message, ...]:
    """The ``messages`` array as typed messages (developer folds into system)."""
    return tuple(_parse_message(item, f"messages[{i}]") for i, item in enumerate(f.message_array(value)))


def _parse_message(item: object, where: str) -> Message:
    if not isinstance(item, dict):
        raise f.wrong_type(where, "an object", item)
    role = f.string(item, "role", f"{where}.role")
    if role not in ROLES:
        raise f.invalid_value(f"{where}.role", role, f"one of {', '.join(ROLES)}")
    if item.get("function_call") is not None:
        raise Invalid(unsupported(f"{where}.function_call", "belongs to the legacy functions API"))
    content = item.get("content")
    if content is None and role != "assistant":
        raise Invalid(
            bad_request(f"'{where}.content' is required", f"{where}.content", "missing_required_parameter")
        )
    return Message(
        role=ROLES[role],
        content=_content_text(content, f"{where}.content"),
        name=f.string(item, "name", f"{where}.name"),
        tool_call_id=f.string(item, "tool_call_id", f"{where}.tool_call_id"),
        tool_calls=parse_tool_calls(item, where) if role == "assistant" else (),
    )


def _tool_history_param(messages: tuple[Message, ...]) -> str | None:
    """The first message field that is part of a tool history, or None."""
    for i, message in enumerate(messages):
        if message.tool_calls:
            return f"messages[{i}].tool_calls"
        if message.role == "tool":
            return f"messages[{i}].role"
    return None


def _content_text(content: object, where: str) -> str:
    """A chat message's content (absent, a string, or ``text`` / ``refusal`` parts) as one string."""
    if content is None:
        return ""
    return f.text_content(content, where, CHAT_TEXT_KEYS, "text", REFUSED_PART_TYPES)


def parse_stop(value: object) -> tuple[str, ...]:
    """``stop``: a string or up to four non-empty strings (the OpenAI dialects' limit)."""
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise f.wrong_type("stop", "a string or an array of strings", value)
    if len(stops) > MAX_STOP_STRINGS:
        raise Invalid(
            bad_request(f"'stop' allows at most {MAX_STOP_STRINGS} strings, got {len(stops)}", "stop")
        )
    if any(s == "" for s in stops):
        raise Invalid(bad_request("'stop' strings must not be empty", "stop"))
    return tuple(stops)


def _parse_effort(body: dict) -> str | None:
    effort = f.string(body, "reasoning_effort")
    if effort is not None and effort not in EFFORTS:
        raise f.invalid_value("reasoning_effort", effort, f"one of {', '.join(EFFORTS)}")
    return effort


def _parse_stream_options(body: dict) -> bool:
    options = f.obj(body, "stream_options")
    if options is None:
        return False
    return bool(f.boolean(options, "include_usage", "stream_options.include_usage"))


# -- encoders --------------------------------------------------------------------------------
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
        self, text: str, reason: FinishReason, usage: Usage, reasoning: str = "", calls: tuple = ()
    ) -> dict:
        message = {"role": "assistant", "content": text or (None if calls else ""), "refusal": None}
        if calls:
            message["tool_calls"] = [self._tool_call(call) for call in calls]
        if reasoning:
            message["reasoning_content"] = reasoning
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}
        return self._envelope("chat.completion", [choice], usage=usage_payload(usage))

    def role_chunk(self) -> dict:
        """The chunk that opens a stream before any text: the role and empty content."""
        self._role_sent = True
        return self._chunk({"role": "assistant", "content": ""}, None)

    def delta_chunk(self, text: str, field: str = "content") -> dict:
        """A content (or reasoning_content) delta; the first one of the stream also carries
        the role."""
        delta = {field: text}
        if not self._role_sent:
            delta = {"role": "assistant", **delta}
            self._role_sent = True
        return self._chunk(delta, None)

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

    def _chunk(self, delta: dict, reason: FinishReason | None) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
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
