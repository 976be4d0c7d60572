"""Replies the model cannot finish, live through the SDKs: a grammar that lets no token through
and logits that are not finite end the request with an error naming the cause, a plain error
before any output and in-band once a stream has started (Chat: a data frame with a top-level
error; Responses: an error event, then response.failed; Anthropic: an error event). The server
serves the synthetic think model built to overflow its logits after "Paris"."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.api.conftest import API_KEY, chat_stream_text, responses_stream_text, start_lmserve
from tests.fixtures.think_gguf import think_model_path

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]
ASK = [{"role": "user", "content": "Hi"}]
DEAD_END = {"lark": 'start: "Hello" NOPE\nNOPE: /[^\\x00-\\U0010FFFF]/\n'}  # "Hello", then nothing fits
FIRST_WORD = "Paris"  # what the model writes before its logits overflow


@pytest.fixture(scope="module")
def model_server(synthetic_dir, tmp_path_factory):
    model = think_model_path(synthetic_dir, overflow_after=FIRST_WORD)
    server = start_lmserve(
        tmp_path_factory.mktemp("broken"), str(model), "--api-key", API_KEY, "--ctx", "512"
    )
    yield server
    server.stop()


def chat(oai, **fields):
    return oai.chat.completions.create(model="m", messages=ASK, max_tokens=40, temperature=0, **fields)


def read_chat_stream(oai, **fields) -> tuple[str, openai.APIError]:
    chunks = []
    with pytest.raises(openai.APIError) as err:
        for chunk in chat(oai, stream=True, **fields):
            chunks.append(chunk)
    return chat_stream_text(chunks), err.value


def read_responses_stream(oai, **fields) -> tuple[str, list]:
    events = list(oai.responses.create(model="m", input="Hi", max_output_tokens=40, stream=True, **fields))
    return responses_stream_text(events), events


def test_a_grammar_dead_end_names_the_constraint(oai):
    with pytest.raises(openai.BadRequestError) as err:
        chat(oai, extra_body=DEAD_END)
    assert (err.value.code, err.value.param) == ("constraint_dead_end", "lark")
    assert "allows no next token" in err.value.message
    text, error = read_chat_stream(oai, extra_body=DEAD_END)
    assert text == "Hello" and error.body["code"] == "constraint_dead_end" and error.body["param"] == "lark"
    text, events = read_responses_stream(oai, extra_body=DEAD_END)
    assert text == "Hello" and [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert (
        events[-2].code == "constraint_dead_end"
        and "allows no next token" in events[-1].response.error.message
    )


def test_non_finite_logits_are_named(oai, claude):
    with pytest.raises(openai.InternalServerError) as err:
        chat(oai)
    assert err.value.code == "non_finite_logits" and "not finite" in err.value.message
    text, error = read_chat_stream(oai)
    assert text == FIRST_WORD and error.body["code"] == "non_finite_logits"
    text, events = read_responses_stream(oai)
    assert text == FIRST_WORD and [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2].code == "non_finite_logits" and events[-1].response.error.code == "server_error"
    texts = []
    with claude.messages.stream(model="m", max_tokens=40, messages=ASK) as stream:
        with pytest.raises(anthropic.APIStatusError) as failed:
            for event in stream:
                if event.type == "text":
                    texts.append(event.text)
    assert "".join(texts) == FIRST_WORD
    assert (
        failed.value.body["error"]["type"] == "api_error"
        and "not finite" in failed.value.body["error"]["message"]
    )
