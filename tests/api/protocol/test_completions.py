"""The parsers of /v1/completions, /infill, /tokenize and /detokenize: what each field maps to
and what is refused, naming the field."""

from __future__ import annotations

import pytest

from api.errors import ApiError
from api.protocol.completions import CompletionRequest
from api.protocol.infill import InfillRequest
from api.protocol.tokenize import DetokenizeRequest, TokenizeRequest
from inference.types import FileContext


def refused(result) -> str:
    assert isinstance(result, ApiError) and result.status == 400, result
    return result.param


def test_a_text_prompt_maps_to_a_raw_prompt_with_openai_defaults():
    request = CompletionRequest.parse({"model": "m", "prompt": "Once upon"})
    generation = request.to_generation()
    assert generation.messages == () and generation.raw.text == "Once upon"
    assert generation.raw.tokens is None and generation.raw.fim is None
    assert generation.max_tokens == 16  # OpenAI's default for this endpoint
    assert not request.echo and not request.stream


def test_prompt_forms():
    assert CompletionRequest.parse({"prompt": ["one"]}).prompt == "one"
    ids = CompletionRequest.parse({"prompt": [1, 2, 3]})
    assert ids.prompt_tokens == (1, 2, 3) and ids.to_generation().raw.tokens == (1, 2, 3)
    assert CompletionRequest.parse({"prompt": [[4, 5]]}).prompt_tokens == (4, 5)
    for bad in (None, [], ["a", "b"], [[1], [2]], [1, "a"], [True], 5, {"text": "a"}):
        assert refused(CompletionRequest.parse({"prompt": bad})) == "prompt", bad


def test_fields_map_onto_the_generation():
    request = CompletionRequest.parse(
        {
            "prompt": "p",
            "echo": True,
            "max_tokens": 7,
            "stop": "\n",
            "stream": True,
            "stream_options": {"include_usage": True},
            "suffix": "tail",
            "temperature": 0,
            "top_p": 0.5,
            "seed": 3,
            "top_k": 4,
            "min_p": 0.1,
            "repeat_penalty": 1.1,
            "ignore_eos": True,
            "user": "u",
            "n": 1,
            "best_of": 1,
            "logprobs": 0,
            "logit_bias": {},
        }
    )
    generation = request.to_generation()
    assert request.echo and request.include_usage and request.stream
    assert generation.max_tokens == 7 and generation.stop == ("\n",) and generation.ignore_eos
    assert generation.raw.fim.suffix == "tail" and not generation.raw.fim.repository
    sampling = generation.sampling
    assert (sampling.temperature, sampling.top_p, sampling.seed, sampling.top_k) == (0.0, 0.5, 3, 4)
    assert CompletionRequest.parse({"prompt": "p", "suffix": ""}).suffix is None  # nothing follows


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"best_of": 2}, "best_of"),
        ({"logprobs": 6}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
        ({"logit_bias": {"5": 1}}, "logit_bias"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"suffix": 1}, "suffix"),
        ({"echo": "yes"}, "echo"),
        ({"stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
    ],
)
def test_completion_refusals_name_the_field(extra, param):
    assert refused(CompletionRequest.parse({"prompt": "p", **extra})) == param


def test_infill_maps_to_the_repository_fim():
    request = InfillRequest.parse(
        {
            "input_prefix": "def f():\n    ",
            "input_suffix": "\n",
            "input_extra": [{"filename": "a.py", "text": "x = 1\n"}, {"text": "y = 2\n"}],
            "prompt": "ret",
            "n_predict": 9,
            "top_k": 1,
            "stream": True,
            "cache_prompt": True,
            "samplers": ["top_k"],
        }
    )
    generation = request.to_generation()
    raw = generation.raw
    assert raw.text == "def f():\n    " and raw.param == "input_prefix"
    assert raw.fim.suffix == "\n" and raw.fim.after_prefix == "ret" and raw.fim.repository
    assert raw.fim.extra == (FileContext("a.py", "x = 1\n"), FileContext("tmp", "y = 2\n"))
    assert raw.fim.param == "input_suffix"
    assert generation.max_tokens == 9 and generation.sampling.top_k == 1 and request.stream


def test_infill_budget():
    assert InfillRequest.parse({}).n_predict is None
    assert InfillRequest.parse({"n_predict": -1}).n_predict is None
    assert InfillRequest.parse({"max_tokens": 5}).n_predict == 5
    assert InfillRequest.parse({"n_predict": 3, "max_tokens": 5}).n_predict == 3  # as llama.cpp
    assert refused(InfillRequest.parse({"n_predict": 0})) == "n_predict"
    assert refused(InfillRequest.parse({"n_predict": -2})) == "n_predict"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input_prefix": 1}, "input_prefix"),
        ({"input_suffix": []}, "input_suffix"),
        ({"input_extra": {}}, "input_extra"),
        ({"input_extra": ["text"]}, "input_extra[0]"),
        ({"input_extra": [{"filename": "a"}]}, "input_extra[0].text"),
        ({"input_extra": [{"text": "t", "filename": 3}]}, "input_extra[0].filename"),
        ({"prompt": ["a"]}, "prompt"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_infill_refusals_name_the_field(body, param):
    assert refused(InfillRequest.parse(body)) == param


def test_tokenize_and_detokenize_requests():
    request = TokenizeRequest.parse({"content": "hi"})
    assert (request.add_special, request.parse_special, request.with_pieces) == (False, True, False)
    assert TokenizeRequest.parse({"content": "", "parse_special": False}).parse_special is False
    assert refused(TokenizeRequest.parse({})) == "content"
    assert refused(TokenizeRequest.parse({"content": "a", "with_pieces": 1})) == "with_pieces"
    assert DetokenizeRequest.parse({"tokens": [1, 2]}).tokens == (1, 2)
    assert refused(DetokenizeRequest.parse({})) == "tokens"
    assert refused(DetokenizeRequest.parse({"tokens": [1, "2"]})) == "tokens[1]"
    assert refused(DetokenizeRequest.parse({"tokens": [True]})) == "tokens[0]"
