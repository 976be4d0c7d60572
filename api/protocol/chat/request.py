"""OpenAI Chat Completions: request validation (the encoders are in ``encoder.py``).

``ChatCompletionRequest.parse`` turns a JSON object into a validated request or an ApiError
(a value, never an exception). Honored fields map onto the dialect-free GenerationRequest;
fields this server cannot honor are refused by name (400, or 501 for ones a later version
implements) instead of being silently dropped; bookkeeping fields (metadata, user, store,
service_tier, parallel_tool_calls, ...) and unknown fields are accepted and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.errors import ApiError, bad_request, unsupported
from inference.engine.logprobs import MAX_TOP_LOGPROBS
from inference.generation.constraints import ConstraintSpec
from inference.generation.toolcall import ToolSpec
from inference.types import GenerationRequest, LogprobsRequest, Message

from .. import common
from .. import fields as f
from ..common import (
    REFUSED_MEDIA_PARTS,
    reasoning_unavailable,
    sampling_overrides,
    tools_unavailable,
    wants_reasoning,
)
from ..fields import Invalid
from ..formats import one_constraint, parse_extensions, parse_format
from ..request_fields import (
    Flag,
    Integer,
    Nothing,
    RequestField,
    Shape,
    as_sent,
    read_fields,
    refuse_any,
)
from .tools import parse_chat_tool_choice, parse_chat_tools, parse_tool_calls

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
CHAT_TEXT_KEYS = {"text": "text", "refusal": "refusal"}
LEGACY_FUNCTIONS = "belongs to the legacy functions API; use 'tools'"


def _refuse_modalities(body: dict, name: str) -> None:
    modalities = f.array(body, name)
    if modalities and any(m != "text" for m in modalities):
        raise Invalid(unsupported(name, "other than ['text'] are not supported"))


# The request body's fields, in the order of OpenAI's reference, then the extensions: what
# ``parse`` reads and what the OpenAPI document declares (api/openapi/openai_requests.py gives
# the Shape fields' structures). Bookkeeping fields (metadata, user, store, service_tier,
# parallel_tool_calls, ...) are not declared: accepted and ignored like any unknown field.
FIELDS = (
    RequestField("messages", Shape(), required=True, read=lambda body, name: parse_messages(body.get(name))),
    common.MODEL,
    RequestField(
        "audio",
        Nothing(),
        refused="text only",
        read=refuse_any("is not supported: this server produces text only"),
    ),
    common.FREQUENCY_PENALTY,
    RequestField(
        "function_call",
        Nothing(),
        refused="the legacy functions API: use tool_choice",
        read=refuse_any(LEGACY_FUNCTIONS),
    ),
    RequestField(
        "functions",
        Nothing(),
        refused="the legacy functions API: use tools",
        read=refuse_any(LEGACY_FUNCTIONS),
    ),
    common.LOGIT_BIAS,
    RequestField("logprobs", Flag(), "report each content token's log probability (choices[0].logprobs)"),
    RequestField("max_completion_tokens", Integer(lo=1)),
    RequestField("max_tokens", Integer(lo=1), "the older name of max_completion_tokens"),
    RequestField("modalities", Shape(), refused="anything but 'text' is refused", read=_refuse_modalities),
    common.N,
    common.PRESENCE_PENALTY,
    common.REASONING_EFFORT,
    RequestField(
        "response_format", Shape(), combined=True, read=lambda body, name: parse_format(body.get(name), name)
    ),
    common.SEED,
    common.OPENAI_STOP,
    RequestField("stream", Flag(), "answer as server-sent chat.completion.chunk events"),
    common.STREAM_OPTIONS,
    common.TEMPERATURE,
    RequestField("tool_choice", Shape(), combined=True, read=as_sent),
    RequestField("tools", Shape(), combined=True, read=lambda body, _name: parse_chat_tools(body)),
    RequestField(
        "top_logprobs",
        Integer(lo=0, hi=MAX_TOP_LOGPROBS),
        "alternatives per token; above 0 needs logprobs: true",
    ),
    common.TOP_P,
    RequestField(
        "web_search_options",
        Nothing(),
        refused="hosted tools are not run here",
        read=refuse_any("(a hosted tool) is not supported"),
    ),
    *common.OPENAI_EXTENSIONS,
)


@dataclass(frozen=True, kw_only=True)
class ChatCompletionRequest:
    """A validated request; fields in the order of OpenAI's reference, then our extensions.

    Each field of :data:`FIELDS` that is not combined, refused or ignored becomes the attribute
    of the same name; the others are what ``parse`` makes of the combined ones."""

    messages: tuple[Message, ...]
    model: str | None = None  # accepted and ignored: one process serves one model
    frequency_penalty: float | None = None
    logprobs: bool = False
    max_completion_tokens: int | None = None
    max_tokens: int | None = None
    presence_penalty: float | None = None
    reasoning_effort: str | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage
    temperature: float | None = None
    top_logprobs: int | None = None  # alternatives per token (0..20), with logprobs only
    top_p: float | None = None
    # Extensions with llama.cpp precedent.
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    ignore_eos: bool = False
    # response_format json_object / json_schema, or the regex / lark extensions.
    constraint: ConstraintSpec | None = None
    tools: tuple[ToolSpec, ...] = ()  # as the model sees them (none under tool_choice "none")
    # The first field that needs a function-calling convention (tools, or a tool history:
    # an assistant's tool_calls, a role "tool" message), whatever tool_choice says.
    tools_param: str | None = None

    @classmethod
    def parse(cls, body: dict) -> ChatCompletionRequest | ApiError:
        """Validate a decoded JSON object; the first problem found is returned as an ApiError."""
        try:
            read = read_fields(FIELDS, body)
            # top_logprobs 0 asks for nothing: clients send it by default, logprobs or not.
            if read["top_logprobs"] and not read["logprobs"]:
                message = "'top_logprobs' needs 'logprobs': true"
                raise Invalid(bad_request(message, "top_logprobs"))
            tools, forced = parse_chat_tool_choice(body, read["tools"])
            return cls(
                **read.attributes(),
                include_usage=read["stream_options"],
                tools=tools,
                tools_param="tools" if read["tools"] else _tool_history_param(read["messages"]),
                constraint=one_constraint(
                    read["response_format"], parse_extensions(read["regex"], read["lark"]), forced
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
            return tools_unavailable(self.tools_param)
        reasoning = wants_reasoning(self.reasoning_effort)
        if reasoning and not reasoning_available:
            return reasoning_unavailable("reasoning_effort", self.reasoning_effort)
        budget = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return GenerationRequest(
            messages=self.messages,
            sampling=sampling_overrides(self),
            max_tokens=budget,
            stop=self.stop,
            ignore_eos=self.ignore_eos,
            reasoning=reasoning and self.constraint is None,
            constraint=self.constraint,
            tools=self.tools,
            logprobs=LogprobsRequest(self.top_logprobs or 0, "logprobs") if self.logprobs else None,
        )


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
    return f.text_content(content, where, CHAT_TEXT_KEYS, "text", REFUSED_MEDIA_PARTS)
