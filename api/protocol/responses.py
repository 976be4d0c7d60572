"""OpenAI Responses: request validation onto the dialect-free GenerationRequest.

Stateless (``store: false`` semantics): every request carries its whole conversation, so
anything that points at server-side state (previous_response_id, conversation, item_reference,
stored prompts, background runs) is refused by name, as are hosted tools and
``truncation: "auto"``. Bookkeeping fields (store, metadata, include, user, ...) are accepted
and ignored. The encoders live in :mod:`api.protocol.responses_encoder`.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.errors import ApiError, bad_request, not_implemented, unsupported
from inference.types import GenerationRequest, Message, SamplingOverrides

from . import fields as f
from .chat import REFUSED_PART_TYPES, parse_stop
from .fields import Invalid

EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
REASONING_OFF = (None, "none", "minimal")
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PART_KEYS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
TOOL_ITEM_TYPES = ("function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output")
CLIENT_TOOL_TYPES = ("function", "custom")  # run by the client: they land with tool calling
STATELESS = "this server is stateless (store: false semantics); send the whole conversation in 'input'"


@dataclass(frozen=True)
class ResponsesRequest:
    """A validated request; fields in the order of OpenAI's reference, then our extensions."""

    input: tuple[Message, ...]
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str | None = None  # accepted and ignored: one process serves one model
    reasoning_effort: str | None = None  # reasoning.effort
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    # Extensions (llama.cpp precedent), as on the Chat Completions dialect.
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    ignore_eos: bool = False

    @classmethod
    def parse(cls, body: dict) -> ResponsesRequest | ApiError:
        """Validate a decoded JSON object; the first problem found is returned as an ApiError."""
        try:
            _refuse_stateful(body)
            _refuse_tools(body)
            _check_text_format(body)
            return cls(
                input=parse_input(body.get("input")),
                instructions=f.string(body, "instructions"),
                max_output_tokens=f.integer(body, "max_output_tokens", lo=1),
                model=f.string(body, "model"),
                reasoning_effort=_parse_effort(body),
                stream=bool(f.boolean(body, "stream")),
                temperature=f.number(body, "temperature", 0.0, 2.0),
                top_p=f.number(body, "top_p", 0.0, 1.0),
                frequency_penalty=f.number(body, "frequency_penalty", -2.0, 2.0),
                presence_penalty=f.number(body, "presence_penalty", -2.0, 2.0),
                seed=f.integer(body, "seed"),
                stop=parse_stop(body.get("stop")),
                top_k=f.integer(body, "top_k", lo=0),
                min_p=f.number(body, "min_p", 0.0, 1.0),
                repeat_penalty=f.number(body, "repeat_penalty", 0.0, 10.0, lo_open=True),
                ignore_eos=bool(f.boolean(body, "ignore_eos")),
            )
        except Invalid as exc:
            return exc.error

    @property
    def wants_reasoning(self) -> bool:
        return self.reasoning_effort not in REASONING_OFF

    def to_generation(self, reasoning_available: bool) -> GenerationRequest | ApiError:
        """The dialect-free request; reasoning needs a model with a reasoning channel."""
        if self.wants_reasoning and not reasoning_available:
            return unsupported(
                "reasoning.effort",
                f"{self.reasoning_effort!r} needs a model with a reasoning channel, and this one has "
                "none; use 'none' or 'minimal'",
            )
        system = (Message("system", self.instructions),) if self.instructions is not None else ()
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
        return GenerationRequest(
            (*system, *self.input),
            sampling,
            self.max_output_tokens,
            self.stop,
            self.ignore_eos,
            reasoning=self.wants_reasoning,
        )


# -- refused and not-yet-implemented parameters ---------------------------------------------
def _refuse_stateful(body: dict) -> None:
    for name in ("previous_response_id", "conversation"):
        if body.get(name) is not None:
            raise Invalid(unsupported(name, f"is not supported: {STATELESS}"))
    if body.get("prompt") is not None:
        raise Invalid(unsupported("prompt", "(a stored prompt template) is not supported: " + STATELESS))
    if f.boolean(body, "background"):
        raise Invalid(unsupported("background", "is not supported: responses are generated while you wait"))
    truncation = f.string(body, "truncation")
    if truncation == "auto":
        raise Invalid(
            unsupported("truncation", "'auto' is not supported: a prompt that does not fit is refused")
        )
    if truncation not in (None, "disabled"):
        raise Invalid(bad_request(f"Invalid value for 'truncation': {truncation!r}", "truncation"))
    top_logprobs = f.integer(body, "top_logprobs", lo=0)
    if top_logprobs:
        raise Invalid(unsupported("top_logprobs"))


def _refuse_tools(body: dict) -> None:
    """Hosted tools are refused (400); client tools land with tool calling (501 until then)."""
    tools = f.array(body, "tools") or []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise f.wrong_type(f"tools[{i}]", "an object", tool)
        kind = tool.get("type")
        if kind not in CLIENT_TOOL_TYPES:
            raise Invalid(
                unsupported(f"tools[{i}].type", f"{kind!r} is a hosted tool; this server runs no tools")
            )
    if tools:
        raise Invalid(not_implemented("tools"))
    if body.get("tool_choice") not in (None, "none", "auto"):
        raise Invalid(not_implemented("tool_choice"))


def _check_text_format(body: dict) -> None:
    text = f.obj(body, "text")
    text_format = f.obj(text, "format", "text.format") if text is not None else None
    if text_format is None:
        return
    kind = text_format.get("type")
    if kind in ("json_schema", "json_object"):
        raise Invalid(not_implemented("text.format"))
    if kind != "text":
        raise Invalid(bad_request(f"Invalid value for 'text.format.type': {kind!r}", "text.format.type"))


def _parse_effort(body: dict) -> str | None:
    reasoning = f.obj(body, "reasoning")
    if reasoning is None:
        return None
    effort = f.string(reasoning, "effort", "reasoning.effort")
    if effort is not None and effort not in EFFORTS:
        raise Invalid(
            bad_request(
                f"Invalid value for 'reasoning.effort': {effort!r}; expected one of {', '.join(EFFORTS)}",
                "reasoning.effort",
            )
        )
    return effort


# -- input -----------------------------------------------------------------------------------
def parse_input(value: object) -> tuple[Message, ...]:
    """``input`` (a string, or an array of items) as typed messages. Replayed reasoning items
    are dropped: the model never sees its earlier reasoning, as with a stateless replay."""
    if value is None:
        raise Invalid(bad_request("'input' is required", "input", "missing_required_parameter"))
    if isinstance(value, str):
        return (Message("user", value),)
    if not isinstance(value, list):
        raise f.wrong_type("input", "a string or an array of input items", value)
    messages = [_parse_item(item, f"input[{i}]") for i, item in enumerate(value)]
    kept = tuple(m for m in messages if m is not None)
    if not kept:
        raise Invalid(bad_request("'input' must contain at least one message", "input"))
    return kept


def _parse_item(item: object, where: str) -> Message | None:
    if not isinstance(item, dict):
        raise f.wrong_type(where, "an object", item)
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        return _parse_message(item, where)
    if kind == "reasoning":
        return None
    if kind == "item_reference":
        raise Invalid(unsupported(f"{where}.type", f"'item_reference' is not supported: {STATELESS}"))
    if kind in TOOL_ITEM_TYPES:
        raise Invalid(not_implemented(f"{where}.type"))
    raise Invalid(
        bad_request(
            f"Invalid value for '{where}.type': {kind!r}; expected a message or a reasoning item",
            f"{where}.type",
        )
    )


def _parse_message(item: dict, where: str) -> Message:
    role = item.get("role")
    if role not in ROLES:
        raise Invalid(
            bad_request(
                f"Invalid value for '{where}.role': {role!r}; expected one of {', '.join(ROLES)}",
                f"{where}.role",
            )
        )
    content = item.get("content")
    if content is None:
        raise Invalid(
            bad_request(f"'{where}.content' is required", f"{where}.content", "missing_required_parameter")
        )
    return Message(ROLES[role], _content_text(content, f"{where}.content"))


def _content_text(content: object, where: str) -> str:
    """A message's content (a string or an array of text parts) as one string."""
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
        key = TEXT_PART_KEYS.get(kind)
        if key is None:
            raise Invalid(
                bad_request(f"Invalid value for '{at}.type': {kind!r}; expected 'input_text'", f"{at}.type")
            )
        text = part.get(key)
        if not isinstance(text, str):
            raise f.wrong_type(f"{at}.{key}", "a string", text)
        texts.append(text)
    return "".join(texts)
