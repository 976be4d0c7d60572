"""The request bodies of llama.cpp's own endpoints (/infill, /tokenize, /detokenize), declared
beside their parsers in api/protocol/ and checked against them like the dialects'."""

from __future__ import annotations

from api.protocol.infill import request as infill

from .openai_requests import SAMPLING
from .shapes import array, boolean, ignored, integer, obj, string

INFILL_REQUEST = obj(
    {
        "input_prefix": string("the text before the gap"),
        "input_suffix": string("the text after the gap (400 naming it on a model without FIM tokens)"),
        "input_extra": array(
            obj(
                {"filename": string("default tmp"), "text": string(nullable=False)},
                ("text",),
            ),
            "other files of the project, before the prefix (llama.cpp's repository pattern)",
        ),
        "prompt": string("appended to the prefix (special-token texts parsed)"),
        "n_predict": integer(lo=-1, description="reply budget; -1 or absent: the server's default"),
        "max_tokens": integer(lo=-1, description="read when n_predict is absent"),
        "stream": boolean("answer as data: chunks {content, stop: false}, then one with stop: true"),
        "stop": {
            "anyOf": [
                string(nullable=True, minLength=1),
                array(string(nullable=False, minLength=1)),
            ],
            "description": "strings that end the reply (not included)",
        },
        **{name: SAMPLING[name] for name in (*infill.INFILL_SAMPLING, "ignore_eos")},
        **{
            name: ignored({}, "llama-server's scheduler: accepted and ignored")
            for name in (
                "cache_prompt",
                "samplers",
                "t_max_prompt_ms",
                "t_max_predict_ms",
                "n_indent",
                "id_slot",
            )
        },
        "response_fields": ignored({}, "accepted and ignored: the whole answer is sent"),
    },
    (),
    "llama.cpp's /infill request (fill in the middle); unknown fields are accepted and ignored",
)
TOKENIZE_REQUEST = obj(
    {
        "content": string(nullable=False),
        "add_special": boolean("prepend BOS as the model's metadata says (default false)"),
        "parse_special": boolean("special-token texts become their tokens (default true)"),
        "with_pieces": boolean("answer [{id, piece}] (piece: text, or byte values when not UTF-8)"),
    },
    ("content",),
    "llama.cpp's /tokenize request",
)
DETOKENIZE_REQUEST = obj(
    {"tokens": array(integer(nullable=False), nullable=False, description="ids in the vocabulary")},
    ("tokens",),
    "llama.cpp's /detokenize request",
)
