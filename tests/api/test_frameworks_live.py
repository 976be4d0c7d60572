"""LangChain and litellm against the live shared server: a plain call works, and a prompt too
long for ``--ctx`` raises each framework's own context-window error (they recognise the
wording lmserve uses), which is what their trimming and fallbacks act on."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no model-price download at import

import litellm  # noqa: E402
from langchain_core.exceptions import ContextOverflowError  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402

from .conftest import API_KEY  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TOO_LONG = "word " * 1500  # the shared server's --ctx is 1024


@pytest.fixture
def chat(idle_server):
    return ChatOpenAI(
        base_url=idle_server.url + "/v1", api_key=API_KEY, model="local", max_retries=0, max_tokens=8
    )


def test_langchain_chat_openai(chat):
    reply = chat.invoke("Say hello.")
    assert reply.content.strip() and reply.usage_metadata["input_tokens"] > 0


def test_langchain_maps_the_overflow_to_its_context_error(chat):
    with pytest.raises(ContextOverflowError):
        chat.invoke(TOO_LONG)


@pytest.mark.parametrize(
    ("model", "base"), [("openai/local", "/v1"), ("anthropic/local", "")], ids=["openai", "anthropic"]
)
def test_litellm_maps_the_overflow_to_its_context_error(idle_server, model, base):
    options = {"model": model, "api_base": idle_server.url + base, "api_key": API_KEY, "max_tokens": 8}
    reply = litellm.completion(messages=[{"role": "user", "content": "Say hello."}], **options)
    assert reply.choices[0].message.content.strip()
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(messages=[{"role": "user", "content": TOO_LONG}], num_retries=0, **options)
