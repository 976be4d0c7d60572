"""The request bodies of llama.cpp's own endpoints (/infill, /tokenize, /detokenize), declared
beside their parsers in api/protocol/ and checked against them like the dialects'."""

from __future__ import annotations

from api.protocol.infill import request as infill
from api.protocol.tokenize import request as tokenize

from .declared import request_schema
from .shapes import array, integer, obj, string

INFILL_REQUEST = request_schema(
    infill.FIELDS,
    {
        "input_extra": array(
            obj(
                {"filename": string("default tmp"), "text": string(nullable=False)},
                ("text",),
            ),
            "other files of the project, before the prefix (llama.cpp's repository pattern)",
        ),
    },
    "llama.cpp's /infill request (fill in the middle); unknown fields are accepted and ignored",
)
TOKENIZE_REQUEST = request_schema(tokenize.TOKENIZE_FIELDS, {}, "llama.cpp's /tokenize request")
DETOKENIZE_REQUEST = request_schema(
    tokenize.DETOKENIZE_FIELDS,
    {"tokens": array(integer(nullable=False), nullable=False, description="ids in the vocabulary")},
    "llama.cpp's /detokenize request",
)
