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

from api.errors import ApiError, bad_request, not_implemented, unsupported
from inference.types import FinishReason, GenerationRequest, Message, SamplingOverrides, Usage

from . import fields as f
from .fields import Invalid

MAX_STOP_STRINGS = 4
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
REFUSED_PART_TYPES = {
    "image_url": "image input",
    "input_image": "image input",
    "input_audio": "audio input",
    "audio": "audio input",
    "file": "file input",
    "input_file": "file input",
}
REASONING_OFF = (None, "none", "minimal")  # reasoning is off by default: these are honored as-is


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

    @classmethod
    def parse(cls, body: dict) -> ChatCompletionRequest | ApiError:
        """Validate a decoded JSON object; the first problem found is returned as an ApiError."""
        try:
            _refuse_unsupported(body)
            return cls(
                messages=parse_messages(body.get("messages")),
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
            )
        except Invalid as exc:
            return exc.error

    def to_generation(self) -> GenerationRequest:
        """The dialect-free request the worker serves."""
        sampling = SamplingOverrides(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repeat_penalty=self.repeat_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=self.seed,
        )
        budget = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return GenerationRequest(self.messages, sampling, budget, self.stop, self.ignore_eos)


# -- refused parameters ----------------------------------------------------------------------
def _refuse_unsupported(body: dict) -> None:
    n = f.integer(body, "n", lo=1)
    if n is not None and n > 1:
        raise Invalid(unsupported("n", "> 1 is not supported: this server returns one choice"))
    if f.boolean(body, "logprobs"):
        raise Invalid(unsupported("logprobs"))
    if body.get("top_logprobs") is not None:
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
    _refuse_not_yet_implemented(body)


def _refuse_not_yet_implemented(body: dict) -> None:
    """Fields a later version honors; until then a 501 naming them, never silence."""
    tools = f.array(body, "tools")
    if tools:
        raise Invalid(not_implemented("tools"))
    if body.get("tool_choice") not in (None, "none", "auto"):
        raise Invalid(not_implemented("tool_choice"))
    response_format = f.obj(body, "response_format")
    if response_format is not None and response_format.get("type") != "text":
        kind = response_format.get("type")
        if kind in ("json_object", "json_schema"):
            raise Invalid(not_implemented("response_format"))
        raise Invalid(
            bad_request(f"Invalid value for 'response_format.type': {kind!r}", "response_format.type")
        )
    if body.get("reasoning_effort") not in REASONING_OFF:
        raise Invalid(not_implemented("reasoning_effort"))


# -- messages --------------------------------------------------------------------------------
def parse_messages(value: object) -> tuple[Message, ...]:
    """The ``messages`` array as typed messages (developer folds into system)."""
    if value is None:
        raise Invalid(bad_request("'messages' is required", "messages", "missing_required_parameter"))
    if not isinstance(value, list):
        raise f.wrong_type("messages", "an array", value)
    if not value:
        raise Invalid(bad_request("'messages' must contain at least one message", "messages"))
    return tuple(_parse_message(item, f"messages[{i}]") for i, item in enumerate(value))


def _parse_message(item: object, where: str) -> Message:
    if not isinstance(item, dict):
        raise f.wrong_type(where, "an object", item)
    role = item.get("role")
    if role not in ROLES:
        raise Invalid(
            bad_request(
                f"Invalid value for '{where}.role': {role!r}; expected one of {', '.join(ROLES)}",
                f"{where}.role",
            )
        )
    if item.get("tool_calls"):
        raise Invalid(not_implemented(f"{where}.tool_calls"))
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
    )


def _content_text(content: object, where: str) -> str:
    """A message's content (a string or an array of text parts) as one string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise f.wrong_type(where, "a string or an array of content parts", content)
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise f.wrong_type(at, "an object", part)
        kind = part.get("type")
        if kind in REFUSED_PART_TYPES:
            raise Invalid(unsupported(f"{at}.type", f"{kind!r}: {REFUSED_PART_TYPES[kind]} is not supported"))
        key = {"text": "text", "refusal": "refusal"}.get(kind)
        if key is None:
            raise Invalid(
                bad_request(f"Invalid value for '{at}.type': {kind!r}; expected 'text'", f"{at}.type")
            )
        text = part.get(key)
        if not isinstance(text, str):
            raise f.wrong_type(f"{at}.{key}", "a string", text)
        texts.append(text)
    return "".join(texts)


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
    }


class ChatEncoder:
    """Builds the chat.completion object or chat.completion.chunk payloads of one reply."""

    def __init__(self, model_id: str):
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model_id
        self._role_sent = False

    def completion(self, text: str, reason: FinishReason, usage: Usage) -> dict:
        message = {"role": "assistant", "content": text, "refusal": None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}
        return self._envelope("chat.completion", [choice], usage=usage_payload(usage))

    def delta_chunk(self, text: str) -> dict:
        """A content delta; the first one of the stream also carries the role."""
        delta = {"content": text}
        if not self._role_sent:
            delta = {"role": "assistant", **delta}
            self._role_sent = True
        return self._chunk(delta, None)

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
