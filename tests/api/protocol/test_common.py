"""What the three dialects parse alike, stated once in api.protocol.common."""

from __future__ import annotations

import pytest

from api.protocol import common
from api.protocol.anthropic import MessagesRequest
from api.protocol.chat import ChatCompletionRequest
from api.protocol.common import call_from
from api.protocol.fields import Invalid, parse_stop_strings
from api.protocol.request_fields import read_fields
from api.protocol.responses import ResponsesRequest
from inference.generation.toolcall import ToolCall

HI = [{"role": "user", "content": "Hi"}]


def test_stop_strings_have_one_wording_in_every_dialect():
    chat = ChatCompletionRequest.parse({"messages": HI, "stop": ["a", ""]})
    responses = ResponsesRequest.parse({"input": "Hi", "stop": ["a", ""]})
    anthropic = MessagesRequest.parse({"messages": HI, "max_tokens": 4, "stop_sequences": ["a", ""]})
    assert chat.message == responses.message == "'stop' must not contain empty strings"
    assert anthropic.message == "'stop_sequences' must not contain empty strings"
    assert ChatCompletionRequest.parse({"messages": HI, "stop": "x"}).stop == ("x",)
    too_many = ChatCompletionRequest.parse({"messages": HI, "stop": list("abcde")})
    assert too_many.status == 400 and "at most 4" in too_many.message
    with pytest.raises(Invalid):
        parse_stop_strings("x", "stop_sequences", single=False)


def test_sampling_ranges_are_shared_and_anthropic_caps_temperature_at_one():
    sampling = read_fields((common.TEMPERATURE, common.TOP_K), {"temperature": 1.5, "top_k": 3})
    assert sampling.attributes() == {"temperature": 1.5, "top_k": 3}
    assert ChatCompletionRequest.parse({"messages": HI, "temperature": 1.5}).temperature == 1.5
    assert ResponsesRequest.parse({"input": "Hi", "temperature": 1.5}).temperature == 1.5
    refused = MessagesRequest.parse({"messages": HI, "max_tokens": 4, "temperature": 1.5})
    assert refused.status == 400 and refused.param == "temperature"
    for body in ({"repeat_penalty": 0}, {"min_p": 1.5}, {"top_k": -1}, {"frequency_penalty": 3}):
        error = ChatCompletionRequest.parse({"messages": HI, **body})
        assert error.status == 400 and error.param == next(iter(body)), body


def test_effort_and_capability_checks_read_alike():
    chat = ChatCompletionRequest.parse({"messages": HI, "reasoning_effort": "high"})
    responses = ResponsesRequest.parse({"input": "Hi", "reasoning": {"effort": "high"}})
    chat_error, responses_error = chat.to_generation(False), responses.to_generation(False)
    assert chat_error.param == "reasoning_effort" and responses_error.param == "reasoning.effort"
    assert chat_error.message.split(" ", 1)[1] == responses_error.message.split(" ", 1)[1]
    bad = ChatCompletionRequest.parse({"messages": HI, "reasoning_effort": "max"})
    assert bad.status == 400 and "one of none, minimal" in bad.message


def test_call_arguments_normalise_to_compact_json():
    assert call_from("f", '{"a":  1}', as_string=True, as_object=False) == ToolCall("f", '{"a": 1}')
    assert call_from("f", {"a": "é"}, as_string=False, as_object=True) == ToolCall("f", '{"a": "é"}')
    assert call_from("f", {"a": 1}, as_string=True, as_object=False) is None
    assert call_from("f", "[1]", as_string=True, as_object=True) is None
    assert call_from("", "{}", as_string=True, as_object=True) is None
