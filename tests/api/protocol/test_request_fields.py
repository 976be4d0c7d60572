"""The request-field declarations: how a body is read through them, and that each dialect's
request type takes exactly the attributes its declaration gives."""

from __future__ import annotations

import dataclasses

import pytest

from api.protocol.anthropic.request import FIELDS as MESSAGES_FIELDS
from api.protocol.anthropic.request import MessagesRequest
from api.protocol.chat.request import FIELDS as CHAT_FIELDS
from api.protocol.chat.request import ChatCompletionRequest
from api.protocol.completions.request import FIELDS as COMPLETION_FIELDS
from api.protocol.completions.request import CompletionRequest
from api.protocol.embeddings.request import FIELDS as EMBEDDINGS_FIELDS
from api.protocol.embeddings.request import EmbeddingsRequest
from api.protocol.fields import Invalid
from api.protocol.infill.request import FIELDS as INFILL_FIELDS
from api.protocol.infill.request import InfillRequest
from api.protocol.request_fields import (
    Choice,
    Flag,
    Integer,
    Nothing,
    RequestField,
    Text,
    read_fields,
    refuse_any,
)
from api.protocol.responses.request import FIELDS as RESPONSES_FIELDS
from api.protocol.responses.request import ResponsesRequest
from api.protocol.tokenize.request import (
    DETOKENIZE_FIELDS,
    TOKENIZE_FIELDS,
    DetokenizeRequest,
    TokenizeRequest,
)

DECLARED = [
    RequestField("count", Integer(lo=1), required=True),
    RequestField("name", Text()),
    RequestField("loud", Flag()),
    RequestField("shout", Text(), combined=True),
    RequestField("legacy", Nothing(), refused="refused", read=refuse_any("is not supported here")),
    RequestField("note", Text(), ignored=True),
]


def test_a_body_reads_into_attributes_and_combined_values():
    read = read_fields(DECLARED, {"count": 2, "shout": "HI", "note": 5})
    assert read.attributes() == {"count": 2, "name": None, "loud": False}
    assert read["shout"] == "HI"


def test_a_missing_required_field_is_named():
    with pytest.raises(Invalid) as caught:
        read_fields(DECLARED, {"name": "x"})
    assert caught.value.error.param == "count"
    assert caught.value.error.code == "missing_required_parameter"
    assert caught.value.error.message == "'count' is required"


def test_refusals_come_before_other_problems():
    with pytest.raises(Invalid) as caught:
        read_fields(DECLARED, {"count": "x", "legacy": 1})
    assert caught.value.error.param == "legacy"
    assert caught.value.error.message == "'legacy' is not supported here"


def test_a_wrong_type_names_the_field():
    with pytest.raises(Invalid) as caught:
        read_fields(DECLARED, {"count": 1, "loud": "yes"})
    assert caught.value.error.param == "loud"


@pytest.mark.parametrize(
    ("kind", "good", "bad", "expected"),
    [
        (Choice(("auto", "none")), "none", "some", "one of auto, none"),
        (Choice((False,)), False, True, "one of false"),
    ],
)
def test_a_choice_reads_its_values_and_names_the_others(kind, good, bad, expected):
    assert kind.read({"x": good}, "x") == good and kind.read({}, "x") is None
    with pytest.raises(Invalid) as caught:
        kind.read({"x": bad}, "x")
    assert caught.value.error.param == "x" and caught.value.error.message.endswith(f"expected {expected}")
    with pytest.raises(Invalid):  # a string where a boolean goes, and the other way round
        kind.read({"x": str(good) if isinstance(good, bool) else True}, "x")


REQUESTS = [
    (CHAT_FIELDS, ChatCompletionRequest),
    (RESPONSES_FIELDS, ResponsesRequest),
    (MESSAGES_FIELDS, MessagesRequest),
    (COMPLETION_FIELDS, CompletionRequest),
    (INFILL_FIELDS, InfillRequest),
    (TOKENIZE_FIELDS, TokenizeRequest),
    (DETOKENIZE_FIELDS, DetokenizeRequest),
    (EMBEDDINGS_FIELDS, EmbeddingsRequest),
]


@pytest.mark.parametrize(("declared", "request_type"), REQUESTS, ids=lambda v: getattr(v, "__name__", ""))
def test_every_attribute_field_is_an_attribute_of_the_request(declared, request_type):
    attributes = {field.name for field in dataclasses.fields(request_type)}
    kept = [f.name for f in declared if not (f.combined or f.refused or f.ignored)]
    assert set(kept) <= attributes, sorted(set(kept) - attributes)
    names = [field.name for field in declared]
    assert len(names) == len(set(names)), "a field is declared twice"
