"""OpenAI Responses: request validation onto the dialect-free GenerationRequest.

Stateless (``store: false`` semantics): every request carries its whole conversation, so
anything that points at server-side state (previous_response_id, conversation, item_reference,
stored prompts, background runs) is refused by name, as are hosted tools and
``truncation: "auto"``. Function tools and their history items live in
:mod:`api.protocol.responses.tools`. Bookkeeping fields (store, metadata, user, ...) are accepted
and ignored, as are ``include`` values other than ``message.output_text.logprobs`` (which asks
for the output text's log probabilities, ``top_logprobs`` alternatives per token). The
encoders live in :mod:`api.protocol.responses.encoder`.
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
    parse_effort,
    reasoning_unavailable,
    sampling_overrides,
    tools_unavailable,
    wants_reasoning,
)
from ..fields import Invalid
from ..formats import one_constraint, parse_extensions, parse_format
from ..request_fields import (
    Choice,
    Flag,
    Integer,
    Nothing,
    RequestField,
    Shape,
    Text,
    as_sent,
    read_fields,
    refuse_any,
)
from .tools import (
    ResponsesTool,
    ResponsesTools,
    call_output_message,
    custom_call_message,
    function_call_message,
    merge_call_turns,
    parse_responses_tool_choice,
    parse_responses_tools,
)

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PART_KEYS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
INCLUDE_LOGPROBS = "message.output_text.logprobs"  # the include value that asks for log probabilities
STATELESS = "this server is stateless (store: false semantics); send the whole conversation in 'input'"


def _refuse_background(body: dict, name: str) -> None:
    if f.boolean(body, name):
        raise Invalid(unsupported(name, "is not supported: responses are generated while you wait"))


def _refuse_auto_truncation(body: dict, name: str) -> None:
    truncation = f.string(body, name)
    if truncation == "auto":
        raise Invalid(unsupported(name, "'auto' is not supported: a prompt that does not fit is refused"))
    if truncation not in (None, "disabled"):
        raise f.invalid_value(name, truncation)


def _parse_include(body: dict, name: str) -> tuple[str, ...]:
    """``include``: an array of strings; only :data:`INCLUDE_LOGPROBS` changes the reply."""
    include = f.array(body, name)
    if include is None:
        return ()
    for i, value in enumerate(include):
        if not isinstance(value, str):
            raise f.wrong_type(f"{name}[{i}]", "a string", value)
    return tuple(include)


def _parse_reasoning(body: dict, name: str) -> str | None:
    return parse_effort(f.obj(body, name), "effort", f"{name}.effort")


def _parse_text_format(body: dict, name: str) -> ConstraintSpec | None:
    text = f.obj(body, name)
    text_format = f.obj(text, "format", f"{name}.format") if text is not None else None
    return parse_format(text_format, f"{name}.format")


# The request body's fields, in the order of OpenAI's reference, then the extensions (llama.cpp
# precedent, as on Chat Completions): what ``parse`` reads and what the OpenAPI document
# declares (api/openapi/openai_requests.py gives the Shape fields' structures). Bookkeeping
# fields (store, metadata, user, ...) are not declared: accepted and ignored like any unknown.
FIELDS = (
    RequestField(
        "background",
        Choice((False,)),
        refused="true is refused: responses are generated while you wait",
        read=_refuse_background,
    ),
    RequestField(
        "conversation", Nothing(), refused=STATELESS, read=refuse_any(f"is not supported: {STATELESS}")
    ),
    RequestField("include", Shape(), read=_parse_include),
    RequestField("input", Shape(), required=True, read=lambda body, name: parse_input(body.get(name))),
    RequestField("instructions", Text(), "a system message before the input"),
    RequestField("max_output_tokens", Integer(lo=1)),
    common.MODEL,
    RequestField(
        "previous_response_id",
        Nothing(),
        refused=STATELESS,
        read=refuse_any(f"is not supported: {STATELESS}"),
    ),
    RequestField(
        "prompt",
        Nothing(),
        refused="stored prompt templates: " + STATELESS,
        read=refuse_any("(a stored prompt template) is not supported: " + STATELESS),
    ),
    RequestField("reasoning", Shape(), combined=True, read=_parse_reasoning),
    RequestField("stream", Flag(), "answer as server-sent Responses events"),
    common.TEMPERATURE,
    RequestField("text", Shape(), combined=True, read=_parse_text_format),
    RequestField("tool_choice", Shape(), combined=True, read=as_sent),
    RequestField("tools", Shape(), combined=True, read=lambda body, _name: parse_responses_tools(body)),
    RequestField(
        "top_logprobs",
        Integer(lo=0, hi=MAX_TOP_LOGPROBS),
        "alternatives per token (with include's message.output_text.logprobs)",
    ),
    common.TOP_P,
    RequestField(
        "truncation",
        Choice(("disabled",)),
        refused="'auto' is refused: a prompt that does not fit is a 400",
        read=_refuse_auto_truncation,
    ),
    common.FREQUENCY_PENALTY,
    common.PRESENCE_PENALTY,
    common.SEED,
    common.OPENAI_STOP,
    *common.OPENAI_EXTENSIONS,
)


@dataclass(frozen=True, kw_only=True)
class ResponsesRequest:
    """A validated request; fields in the order of OpenAI's reference, then our extensions.

    Each field of :data:`FIELDS` that is not combined, refused or ignored becomes the attribute
    of the same name; the others are what ``parse`` makes of the combined ones."""

    input: tuple[Message, ...]
    include: tuple[str, ...] = ()
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str | None = None  # accepted and ignored: one process serves one model
    reasoning_effort: str | None = None  # reasoning.effort
    stream: bool = False
    temperature: float | None = None
    top_logprobs: int | None = None  # alternatives per token (0..20), with include's logprobs
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
    constraint: ConstraintSpec | None = None  # text.format, regex, lark, or a forced call
    text_format: dict | None = None  # text.format as requested, echoed in the response object
    tools: tuple[ToolSpec, ...] = ()  # as the model sees them (none under tool_choice "none")
    declared_tools: ResponsesTools = ResponsesTools()  # as declared, echoed in the response object
    tool_choice: str | dict = "auto"
    declares_tools: bool = False  # client tools or a tool history arrived, whatever tool_choice says
    forced_custom: ResponsesTool | None = None  # tool_choice forces this custom tool: the reply is its input

    @classmethod
    def parse(cls, body: dict) -> ResponsesRequest | ApiError:
        """Validate a decoded JSON object; the first problem found is returned as an ApiError."""
        try:
            read = read_fields(FIELDS, body)
            declared = read["tools"]
            choice = parse_responses_tool_choice(body, declared)
            return cls(
                **read.attributes(),
                reasoning_effort=read["reasoning"],
                tools=choice.tools,
                declared_tools=declared,
                tool_choice=read["tool_choice"] or "auto",
                declares_tools=bool(declared.client)
                or any(m.tool_calls or m.role == "tool" for m in read["input"]),
                forced_custom=choice.forced_custom,
                constraint=one_constraint(
                    read["text"], parse_extensions(read["regex"], read["lark"]), choice.constraint
                ),
                text_format=_requested_text_format(body),
            )
        except Invalid as exc:
            return exc.error

    @property
    def wants_reasoning(self) -> bool:
        return wants_reasoning(self.reasoning_effort)

    @property
    def wants_logprobs(self) -> bool:
        """Log probabilities are reported only when ``include`` asks, as OpenAI's: a bare
        ``top_logprobs`` leaves the parts' ``logprobs`` empty."""
        return INCLUDE_LOGPROBS in self.include

    def logprobs_request(self) -> LogprobsRequest | None:
        if not self.wants_logprobs:
            return None
        param = "include" if self.top_logprobs is None else "top_logprobs"
        return LogprobsRequest(self.top_logprobs or 0, param)

    def to_generation(
        self, reasoning_available: bool, tools_available: bool = False
    ) -> GenerationRequest | ApiError:
        """The dialect-free request; reasoning needs a model with a reasoning channel, tools a
        model with a function-calling convention."""
        if self.declares_tools and not tools_available:
            return tools_unavailable("tools")
        if self.wants_reasoning and not reasoning_available:
            return reasoning_unavailable("reasoning.effort", self.reasoning_effort)
        system = (Message("system", self.instructions),) if self.instructions is not None else ()
        tools, task = self.tools, ()
        if self.forced_custom is not None:
            # The whole reply is the tool's input: no call markers to scan for, the tool named
            # in a system turn of its own instead of the declarations.
            tools, task = (), (Message("system", forced_custom_task(self.forced_custom)),)
        return GenerationRequest(
            messages=(*system, *self.input, *task),
            sampling=sampling_overrides(self),
            max_tokens=self.max_output_tokens,
            stop=self.stop,
            ignore_eos=self.ignore_eos,
            reasoning=self.wants_reasoning and self.constraint is None,
            constraint=self.constraint,
            tools=tools,
            logprobs=self.logprobs_request(),
        )


def forced_custom_task(tool: ResponsesTool) -> str:
    """What the model is told when tool_choice forces a custom tool: write its input, nothing else."""
    about = f" The tool: {tool.spec.description}" if tool.spec.description else ""
    return f"Reply with the input for the {tool.name!r} tool and nothing else.{about}"


def _requested_text_format(body: dict) -> dict | None:
    """``text.format`` as sent (already validated by ``_parse_text_format``), echoed back."""
    text = body.get("text")
    return text.get("format") if isinstance(text, dict) else None


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
    kept = merge_call_turns([m for m in messages if m is not None])
    if not kept:
        raise Invalid(bad_request("'input' must contain at least one message", "input"))
    return kept


def _parse_item(item: object, where: str) -> Message | None:
    if not isinstance(item, dict):
        raise f.wrong_type(where, "an object", item)
    kind = f.string(item, "type", f"{where}.type")
    if "type" not in item and "role" in item:
        kind = "message"  # an "easy" input message: a role and content, no type
    if kind == "message":
        return _parse_message(item, where)
    if kind == "reasoning":
        return None
    if kind == "item_reference":
        raise Invalid(unsupported(f"{where}.type", f"'item_reference' is not supported: {STATELESS}"))
    if kind == "function_call":
        return function_call_message(item, where)
    if kind == "custom_tool_call":
        return custom_call_message(item, where)
    if kind in ("function_call_output", "custom_tool_call_output"):
        return call_output_message(item, where)
    raise f.invalid_value(f"{where}.type", kind, "a message or a reasoning item")


def _parse_message(item: dict, where: str) -> Message:
    role = f.string(item, "role", f"{where}.role")
    if role not in ROLES:
        raise f.invalid_value(f"{where}.role", role, f"one of {', '.join(ROLES)}")
    content = item.get("content")
    if content is None:
        raise Invalid(
            bad_request(f"'{where}.content' is required", f"{where}.content", "missing_required_parameter")
        )
    return Message(ROLES[role], _content_text(content, f"{where}.content"))


def _content_text(content: object, where: str) -> str:
    """An input message's content (a string or input/output text parts) as one string."""
    return f.text_content(content, where, TEXT_PART_KEYS, "input_text", REFUSED_MEDIA_PARTS)
