"""Parsing the log-probability fields of the OpenAI dialects onto LogprobsRequest."""

from __future__ import annotations

import pytest

from api.errors import ApiError
from api.protocol.chat import ChatCompletionRequest
from api.protocol.responses import ResponsesRequest
from inference.types import LogprobsRequest

USER = [{"role": "user", "content": "hi"}]


def chat(**fields):
    parsed = ChatCompletionRequest.parse({"messages": USER, **fields})
    return parsed if isinstance(parsed, ApiError) else parsed.to_generation(False).logprobs


def responses(**fields):
    parsed = ResponsesRequest.parse({"input": "hi", **fields})
    return parsed if isinstance(parsed, ApiError) else parsed.to_generation(False).logprobs


@pytest.mark.parametrize(
    ("fields", "want"),
    [
        ({}, None),
        ({"logprobs": False}, None),
        ({"logprobs": False, "top_logprobs": 0}, None),  # clients send 0 by default
        ({"logprobs": True}, LogprobsRequest(0, "logprobs")),
        ({"logprobs": True, "top_logprobs": 20}, LogprobsRequest(20, "logprobs")),
        ({"logprobs": True, "top_logprobs": None}, LogprobsRequest(0, "logprobs")),
    ],
)
def test_chat_asks_with_logprobs_true(fields, want):
    assert chat(**fields) == want


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"top_logprobs": 3}, "needs 'logprobs': true"),
        ({"logprobs": False, "top_logprobs": 3}, "needs 'logprobs': true"),
        ({"logprobs": True, "top_logprobs": 21}, "<= 20"),
        ({"logprobs": True, "top_logprobs": -1}, ">= 0"),
        ({"logprobs": True, "top_logprobs": 2.5}, "integer"),
    ],
)
def test_chat_refusals_name_top_logprobs(fields, message):
    error = chat(**fields)
    assert isinstance(error, ApiError) and error.status == 400 and error.param == "top_logprobs"
    assert message in error.message


@pytest.mark.parametrize(
    ("fields", "want"),
    [
        ({}, None),
        ({"top_logprobs": 5}, None),  # without include, OpenAI's parts carry logprobs: []
        ({"include": ["reasoning.encrypted_content"]}, None),
        ({"include": ["message.output_text.logprobs"]}, LogprobsRequest(0, "include")),
        (
            {"include": ["reasoning.encrypted_content", "message.output_text.logprobs"], "top_logprobs": 20},
            LogprobsRequest(20, "top_logprobs"),
        ),
    ],
)
def test_responses_asks_with_include(fields, want):
    assert responses(**fields) == want


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"include": "message.output_text.logprobs"}, "include"),
        ({"include": [3]}, "include[0]"),
    ],
)
def test_responses_refusals_name_the_field(fields, param):
    error = responses(**fields)
    assert isinstance(error, ApiError) and error.status == 400 and error.param == param
