"""Chat templates: the GGUFs' own Jinja templates and the documented fallbacks."""

from __future__ import annotations

from functools import cache

import pytest

from inference.engine.chat_template import FALLBACKS, ChatTemplate, ChatTemplateError
from inference.engine.families import FAMILIES
from inference.engine.gguf_file import GGUFFile
from tests.fixtures.model_files import default_model_path, optional_model_path

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "How are you?"},
]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Wetter für eine Stadt",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@cache
def template_of(name: str) -> ChatTemplate:
    path = default_model_path() if name == "smollm2" else optional_model_path(name)
    gguf = GGUFFile(path)
    return ChatTemplate.from_metadata(gguf.metadata, FAMILIES[gguf.architecture].template_fallback)


def test_smollm2_embedded_template():
    tpl = template_of("smollm2")
    assert not tpl.is_fallback and not tpl.supports_tools
    assert tpl.render(CONVERSATION) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nHow are you?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_smollm2_adds_its_default_system_prompt_without_generation_prompt():
    rendered = template_of("smollm2").render([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert rendered == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
    )


def test_qwen_embedded_template():
    tpl = template_of("qwen2.5-coder-0.5b-instruct.gguf")
    assert not tpl.is_fallback and tpl.supports_tools
    assert tpl.render(CONVERSATION[1:], add_generation_prompt=False) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nHow are you?<|im_end|>\n"
    )
    assert tpl.render(CONVERSATION).endswith("How are you?<|im_end|>\n<|im_start|>assistant\n")


def test_qwen_renders_tools_calls_and_responses():
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
            ],
        },
        {"role": "tool", "content": '{"temp": 21}'},
    ]
    rendered = template_of("qwen2.5-coder-0.5b-instruct.gguf").render(messages, tools=[WEATHER_TOOL])
    assert rendered == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n"
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "get_weather", "description": "Wetter für eine Stadt", '
        '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, '
        '"required": ["city"]}}}\n'
        "</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    )


def test_gemma_fallback_folds_system_into_first_user_turn():
    tpl = template_of("gemma-3-270m-q4_k_m.gguf")
    assert tpl.is_fallback and not tpl.supports_tools
    assert tpl.render(CONVERSATION) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nHow are you?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_gemma_fallback_content_parts_and_bos_override():
    tpl = template_of("gemma-3-270m-q4_k_m.gguf")
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "  Hi "}, {"type": "text", "text": "there"}]}
    ]
    assert tpl.render(messages, add_generation_prompt=False, bos_token="") == (
        "<start_of_turn>user\nHi there<end_of_turn>\n"
    )
    assert tpl.render([CONVERSATION[0]], add_generation_prompt=False) == (
        "<bos><start_of_turn>user\nBe brief.<end_of_turn>\n"
    )


def test_chatml_fallback_for_other_architectures():
    tpl = ChatTemplate.from_metadata({}, FAMILIES["llama"].template_fallback)
    assert tpl.is_fallback
    assert tpl.render(CONVERSATION[:2]) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_hf_helpers_tojson_and_strftime():
    tpl = ChatTemplate(
        "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2) }}|"
        "{{ messages[0] | tojson(separators=(',', ':')) }}|{{ strftime_now('%Y') | length }}"
    )
    rendered = tpl.render([{"role": "user", "content": "héllo <b>"}])
    compact = '{"role":"user","content":"héllo <b>"}'
    spaced = '{"role": "user", "content": "héllo <b>"}'
    indented = '{\n  "role": "user",\n  "content": "héllo <b>"\n}'
    assert rendered == f"{spaced}|{indented}|{compact}|4"


def test_trim_and_lstrip_blocks_like_hf():
    tpl = ChatTemplate("  {% for m in messages %}\n[{{ m.content }}]\n  {% endfor %}\n")
    assert tpl.render([{"content": "a"}, {"content": "b"}]) == "[a]\n[b]\n"


def test_generation_blocks_render_their_body():
    assert ChatTemplate("{% generation %}x{% endgeneration %}").render([]) == "x"


def test_raise_exception_gives_chat_template_error():
    tpl = ChatTemplate(
        "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="first must be user"):
        tpl.render([{"role": "assistant", "content": "x"}])


def test_sandbox_blocks_dunder_attributes():
    tpl = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError, match="unsafe|__class__"):
        tpl.render([])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ ''.__class__.__subclasses__() }}").render([])


def test_sandbox_is_immutable():
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages.append(1) }}").render([])


def test_broken_templates_raise_chat_template_error():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages[0].content + 1 }}").render([{"content": "x"}])


LATE_SYSTEM = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "system", "content": "Agents: explore, plan."},
    {"role": "user", "content": "Go"},
]


def test_a_late_system_message_renders_in_place_where_the_template_allows_it():
    """Qwen2.5's template renders a system turn anywhere: the turns before it keep their
    tokens, so a conversation's warm KV rows stay usable."""
    after_reply = [*LATE_SYSTEM[:2], {"role": "assistant", "content": "Hello."}, *LATE_SYSTEM[2:]]
    rendered = template_of("qwen2.5-coder-0.5b-instruct.gguf").render(after_reply, tools=[WEATHER_TOOL])
    in_place = (
        "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>system\nAgents: explore, plan.<|im_end|>\n"
    )
    assert in_place in rendered
    assert rendered.index("Be brief.") < rendered.index("get_weather") < rendered.index("Agents:")


CLAUDE_CODE_FIRST = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "system", "content": "Environment: linux."},
    {"role": "system", "content": "gitStatus: clean."},
]


def test_context_after_a_user_message_renders_before_it_so_the_reply_answers_the_user():
    qwen = template_of("qwen2.5-coder-0.5b-instruct.gguf")
    rendered = qwen.render(CLAUDE_CODE_FIRST, tools=[WEATHER_TOOL])
    last_turn = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    assert rendered.endswith(last_turn)
    assert rendered.index("get_weather") < rendered.index("Environment") < rendered.index("gitStatus")
    # The next turn of the same conversation starts with the same tokens: its warm rows match.
    next_turn = [
        *CLAUDE_CODE_FIRST,
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And Spain?"},
    ]
    assert qwen.render(next_turn, tools=[WEATHER_TOOL]).startswith(
        rendered.removesuffix("<|im_start|>assistant\n")
    )


def test_a_template_that_refuses_a_late_system_message_gets_it_folded_into_the_leading_one():
    tpl = ChatTemplate(FALLBACKS["gemma4"], "<bos>", "<eos>", is_fallback=True)
    with pytest.raises(ChatTemplateError, match="system messages must come first"):
        tpl._render(LATE_SYSTEM, True, None)
    assert tpl.render(LATE_SYSTEM) == tpl.render(
        [{"role": "system", "content": "Be brief.\n\nAgents: explore, plan."}, *LATE_SYSTEM[1::2]]
    )
    folded = [{"role": "system", "content": "Agents: explore, plan."}, *LATE_SYSTEM[1::2]]
    assert tpl.render(LATE_SYSTEM[1:]) == tpl.render(folded)


def test_folding_leaves_a_template_error_of_another_kind_alone():
    tpl = ChatTemplate("{{ raise_exception('no') }}", "", "")
    with pytest.raises(ChatTemplateError, match="no"):
        tpl.render(CONVERSATION)
