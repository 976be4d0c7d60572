"""Chat prompts rendered from the GGUF's own Jinja template, the way HF transformers renders them.

The template (``tokenizer.chat_template``) runs in jinja2's ``ImmutableSandboxedEnvironment``
with HF's settings and helpers: ``trim_blocks``/``lstrip_blocks``, the ``loopcontrols``
extension, a ``{% generation %}`` block that renders its body, ``raise_exception(msg)``,
``strftime_now(fmt)`` and a ``tojson`` filter that keeps non-ASCII text (``ensure_ascii=False``)
and accepts ``indent``, ``separators`` and ``sort_keys``. The context holds ``messages``,
``add_generation_prompt``, ``tools``, ``bos_token``, ``eos_token`` and any extra keyword
arguments, which override the defaults (``bos_token=""`` drops a template's leading BOS text
when the caller adds the BOS id itself).

Fallback when the file has no template (``ChatTemplate.is_fallback``), as the family names it
(``families.Family.template_fallback``):

- ``gemma`` (the gemma3 family): Gemma's turn format. The text starts with
  ``bos_token``; each message becomes ``<start_of_turn>{role}\\n{content}<end_of_turn>\\n``
  with ``assistant`` spelled ``model`` and content stripped of surrounding whitespace; a
  leading system message is folded into the first turn as ``{system}\\n\\n`` before its
  content (or becomes a user turn of its own when nothing follows it); the generation prompt
  is ``<start_of_turn>model\\n``. Role alternation is not enforced.
- ``gemma4``: Gemma 4's turns, as its released template renders them without tools:
  ``bos_token``; leading system messages (trimmed, joined by a blank line) as one
  ``<|turn>system\\n...<turn|>\\n`` turn, a later system message an error; each message
  ``<|turn>{role}\\n{content}<turn|>\\n`` with ``assistant`` spelled ``model`` (an earlier
  reply's thought channel cut off, up to its ``<channel|>``); the generation prompt
  ``<|turn>model\\n`` and an empty thought channel (``<|channel>thought\\n<channel|>``), so
  the model answers without reasoning. With ``enable_thinking`` the system turn (opened even
  without system messages) starts with ``<|think|>\\n`` and the thought channel is the model's.
- ``inkling``: Inkling's wire format of typed blocks over special tokens, as the reference
  renders it (fucina ``src/llm/inkling/chat.zig``, byte-exact with llama.cpp's rendering of
  ``Inkling.jinja``): each message ``{opener}<|content_text|>{content}<|end_message|>`` with
  openers ``<|message_system|>``, ``<|message_user|>``, ``<|message_model|>``, an assistant
  message followed by ``<|content_model_end_sampling|>``; the line ``Thinking effort level:
  0.9`` as a system message of its own just before the first non-system message (at the end
  when there is none); the generation prompt ``<|message_model|>``, plus ``<|content_text|>``
  when ``enable_thinking`` is false (the model then answers without a thinking block). Other
  roles are an error.
- ``chatml`` (every other family): ChatML, ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per
  message and ``<|im_start|>assistant\\n`` as the generation prompt, without a default system
  prompt.

In every fallback a content given as a list of parts contributes its ``text`` parts.
"""

from __future__ import annotations

import json
import numbers
from datetime import datetime
from typing import Any

import jinja2
import jinja2.meta
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

_CONTENT_MACRO = """
{%- macro text_of(content) -%}
  {%- if content is string -%}{{ content }}
  {%- elif content is iterable -%}
    {%- for part in content if part.type == 'text' -%}{{ part.text }}{%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
"""
GEMMA_FALLBACK = (
    _CONTENT_MACRO
    + """
{{- bos_token -}}
{%- set turns = messages -%}
{%- set ns = namespace(prefix='') -%}
{%- if messages and messages[0].role == 'system' -%}
  {%- set ns.prefix = text_of(messages[0].content) | trim -%}
  {%- set turns = messages[1:] -%}
  {%- if not turns -%}
    {{- '<start_of_turn>user\\n' + ns.prefix + '<end_of_turn>\\n' -}}
  {%- endif -%}
  {%- set ns.prefix = ns.prefix + '\\n\\n' -%}
{%- endif -%}
{%- for message in turns -%}
  {{- '<start_of_turn>' + ('model' if message.role == 'assistant' else message.role) + '\\n' -}}
  {{- (ns.prefix if loop.first else '') + (text_of(message.content) | trim) + '<end_of_turn>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}
"""
)
GEMMA4_FALLBACK = (
    _CONTENT_MACRO
    + """
{{- bos_token -}}
{%- set ns = namespace(system=[], first=0) -%}
{%- for message in messages -%}
  {%- if message.role == 'system' and loop.index0 == ns.first -%}
    {%- set ns.system = ns.system + [text_of(message.content) | trim] -%}
    {%- set ns.first = ns.first + 1 -%}
  {%- endif -%}
{%- endfor -%}
{%- set think = enable_thinking is defined and enable_thinking -%}
{%- if ns.first or think -%}
  {{- '<|turn>system\\n' + ('<|think|>\\n' if think else '') + ns.system | join('\\n\\n') + '<turn|>\\n' -}}
{%- endif -%}
{%- for message in messages[ns.first:] -%}
  {%- if message.role == 'system' -%}{{- raise_exception('system messages must come first') -}}{%- endif -%}
  {%- set text = text_of(message.content) -%}
  {%- if message.role == 'assistant' and '<channel|>' in text -%}
    {%- set text = text.split('<channel|>')[-1] -%}
  {%- endif -%}
  {{- '<|turn>' + ('model' if message.role == 'assistant' else message.role) + '\\n' -}}
  {{- (text | trim) + '<turn|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|turn>model\\n' + ('' if think else '<|channel>thought\\n<channel|>') -}}
{%- endif -%}
"""
)
CHATML_FALLBACK = (
    _CONTENT_MACRO
    + """
{%- for message in messages -%}
  {{- '<|im_start|>' + message.role + '\\n' + text_of(message.content) + '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""
)
INKLING_FALLBACK = (
    _CONTENT_MACRO
    + """
{%- set ns = namespace(effort=false) -%}
{%- set effort = '<|message_system|><|content_text|>Thinking effort level: 0.9<|end_message|>' -%}
{%- set openers = {'system': '<|message_system|>', 'user': '<|message_user|>',
                   'assistant': '<|message_model|>'} -%}
{%- for message in messages -%}
  {%- if message.role not in openers -%}
    {{- raise_exception('inkling has no ' + message.role + ' role (system, user and assistant only)') -}}
  {%- endif -%}
  {%- if message.role != 'system' and not ns.effort -%}{{- effort -}}{%- set ns.effort = true -%}{%- endif -%}
  {{- openers[message.role] + '<|content_text|>' + text_of(message.content) + '<|end_message|>' -}}
  {%- if message.role == 'assistant' -%}{{- '<|content_model_end_sampling|>' -}}{%- endif -%}
{%- endfor -%}
{%- if not ns.effort -%}{{- effort -}}{%- endif -%}
{%- if add_generation_prompt -%}
  {{- '<|message_model|>' -}}
  {%- if enable_thinking is defined and not enable_thinking -%}{{- '<|content_text|>' -}}{%- endif -%}
{%- endif -%}
"""
)
# The documented fallbacks for a GGUF without a template, by the name a family gives.
FALLBACKS = {
    "chatml": CHATML_FALLBACK,
    "gemma": GEMMA_FALLBACK,
    "gemma4": GEMMA4_FALLBACK,
    "inkling": INKLING_FALLBACK,
}


SYSTEM_SEPARATOR = "\n\n"  # system texts folded into one are paragraphs of it


class ChatTemplateError(ValueError):
    """The chat template failed to compile or render; the message says why."""


class _GenerationBlock(Extension):
    """HF's ``{% generation %}...{% endgeneration %}`` marks assistant text; here it just renders."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys=False
):
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template plus the special-token strings it is rendered with."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", is_fallback: bool = False):
        self.source = source
        self.is_fallback = is_fallback
        self.bos_token = bos_token
        self.eos_token = eos_token
        env = _environment()
        try:
            self._template = env.from_string(source)
            variables = jinja2.meta.find_undeclared_variables(env.parse(source))
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc
        self.supports_tools = "tools" in variables

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any], fallback: str = "chatml") -> ChatTemplate:
        """The GGUF's ``tokenizer.chat_template``, or the documented fallback its family names
        (a key of :data:`FALLBACKS`)."""
        bos_token = _token_text(metadata, "tokenizer.ggml.bos_token_id")
        eos_token = _token_text(metadata, "tokenizer.ggml.eos_token_id")
        source = metadata.get("tokenizer.chat_template")
        if isinstance(source, str) and source.strip():
            return cls(source, bos_token, eos_token)
        return cls(FALLBACKS[fallback], bos_token, eos_token, is_fallback=True)

    def render(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        **extra: Any,
    ) -> str:
        """The prompt text for ``messages``; :class:`ChatTemplateError` if the template fails.

        System messages after the first turn (agents send reminders and agent lists that way)
        render where they stand when the template allows it, which keeps the conversation's
        earlier tokens (and so its warm KV rows) unchanged, except that system messages right
        after a user message render just before it (:func:`context_before_its_turn`); a
        template that refuses them gets them folded, in order, into the leading system message
        instead."""
        messages = context_before_its_turn(messages)
        try:
            return self._render(messages, add_generation_prompt, tools, **extra)
        except ChatTemplateError:
            folded = fold_late_system_messages(messages)
            if folded is None:
                raise
            return self._render(folded, add_generation_prompt, tools, **extra)

    def _render(
        self, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None, **extra: Any
    ) -> str:
        context = {
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "tools": tools,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **extra,
        }
        try:
            return self._template.render(**context)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc


def context_before_its_turn(messages: list[dict]) -> list[dict]:
    """``messages`` with each run of system messages that directly follows a user message
    moved just before that user message; every other message keeps its place.

    Claude Code sends the user's prompt and then a system message of context (its environment,
    the git status). Rendered in place, that context is the last turn before the reply, and a
    small model answers it instead of the user: Qwen2.5-Coder-0.5B, greedy, asked "What is the
    capital of France?", called an unrelated tool; with the context before the question it
    answered "Paris". The rule looks at one user message and what follows it, so a later turn
    renders the earlier ones as the first render did, and their warm KV rows still match."""
    ordered: list[dict] = []
    i = 0
    while i < len(messages):
        message = messages[i]
        end = i + 1
        while message.get("role") == "user" and end < len(messages) and messages[end].get("role") == "system":
            end += 1
        ordered += [*messages[i + 1 : end], message]
        i = end
    return ordered


def fold_late_system_messages(messages: list[dict]) -> list[dict] | None:
    """``messages`` with every system message after the leading ones appended, in order, to
    the leading system message (one is made when there is none); None when there is nothing
    to fold. Text content only: a message whose content is a list of parts keeps its text."""
    lead = 0
    while lead < len(messages) and messages[lead].get("role") == "system":
        lead += 1
    late = [m for m in messages[lead:] if m.get("role") == "system"]
    if not late:
        return None
    texts = [_plain_text(m.get("content")) for m in [*messages[:lead], *late]]
    system = {"role": "system", "content": SYSTEM_SEPARATOR.join(t for t in texts if t)}
    return [system, *(m for m in messages[lead:] if m.get("role") != "system")]


def _plain_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


# Unicode noncharacters: reserved for internal use, so neither a vocabulary nor sane text holds them.
NONCHARACTERS = [chr(c) for c in range(0xFDD0, 0xFDF0)] + [
    chr(p + c) for p in range(0, 0x110000, 0x10000) for c in (0xFFFE, 0xFFFF)
]


def unused_mark(*values: Any) -> str:
    """A noncharacter that occurs in no string inside ``values`` (ChatTemplateError if each does)."""
    seen: set[str] = set()

    def note(text: str) -> str:
        seen.update(c for c in NONCHARACTERS if c in text)
        return text

    map_strings(values, note)
    for mark in NONCHARACTERS:
        if mark not in seen:
            return mark
    raise ChatTemplateError("the messages contain every Unicode noncharacter; one must stay free")


def map_strings(value: Any, change) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, scalars) with ``change`` applied to every
    string in it but dict keys."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {key: map_strings(item, change) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [map_strings(item, change) for item in value]
    return value


def _token_text(metadata: dict[str, Any], id_key: str) -> str:
    tokens = metadata.get("tokenizer.ggml.tokens") or []
    token_id = metadata.get(id_key)
    if isinstance(token_id, numbers.Integral) and 0 <= token_id < len(tokens):
        return tokens[token_id]
    return ""
