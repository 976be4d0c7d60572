"""GET /openapi.json: an OpenAPI 3.1 document of every endpoint lmserve serves.

The request bodies are the declarations beside the parsers (openai_requests.py,
anthropic_requests.py); the responses describe the shapes the encoders produce, and every error
the envelope of the endpoint's dialect (OpenAI's ``{"error": {...}}``, Anthropic's
``{"type": "error", "error": {...}}`` on the Messages endpoints).
"""

from __future__ import annotations

from inference.generation.capabilities import CAPABILITY_NAMES

from .anthropic_requests import COUNT_TOKENS_REQUEST, MESSAGES_REQUEST
from .llamacpp_requests import DETOKENIZE_REQUEST, INFILL_REQUEST, TOKENIZE_REQUEST
from .openai_requests import (
    CHAT_COMPLETION_REQUEST,
    COMPLETION_REQUEST,
    EMBEDDINGS_REQUEST,
    RESPONSES_REQUEST,
)
from .shapes import Schema, boolean, const, enum, obj, string

NULLABLE_STRING = {"type": ["string", "null"]}
INTEGER = {"type": "integer"}
# One server-sent event as a reader parses it: its name (named-event dialects) and its data.
SSE_EVENT = obj({"event": string(nullable=False), "data": string(nullable=False)}, ("data",))
SCHEMAS: dict[str, Schema] = {
    "ChatCompletionRequest": CHAT_COMPLETION_REQUEST,
    "ResponsesRequest": RESPONSES_REQUEST,
    "MessagesRequest": MESSAGES_REQUEST,
    "CountTokensRequest": COUNT_TOKENS_REQUEST,
    "EmbeddingsRequest": EMBEDDINGS_REQUEST,
    "CompletionRequest": COMPLETION_REQUEST,
    "InfillRequest": INFILL_REQUEST,
    "TokenizeRequest": TOKENIZE_REQUEST,
    "DetokenizeRequest": DETOKENIZE_REQUEST,
    "TextCompletion": obj(
        {
            "id": string(nullable=False),
            "object": const("text_completion"),
            "created": INTEGER,
            "model": string(nullable=False),
            "choices": {
                "type": "array",
                "items": obj(
                    {
                        "text": string(nullable=False),
                        "index": INTEGER,
                        "logprobs": obj(
                            {
                                "tokens": {"type": "array", "items": {"type": "string"}},
                                "token_logprobs": {"type": "array", "items": {"type": "number"}},
                                "top_logprobs": {"type": "array", "items": {"type": "object"}},
                                "text_offset": {"type": "array", "items": {"type": "integer"}},
                            },
                            ("tokens", "token_logprobs", "top_logprobs", "text_offset"),
                            nullable=True,
                        ),
                        "finish_reason": enum(("stop", "length")),
                    },
                    ("text", "index", "logprobs", "finish_reason"),
                ),
            },
            "usage": obj(
                {"prompt_tokens": INTEGER, "completion_tokens": INTEGER, "total_tokens": INTEGER},
                ("prompt_tokens", "completion_tokens", "total_tokens"),
            ),
        },
        ("id", "object", "created", "model", "choices", "usage"),
    ),
    "Infill": obj(
        {
            "content": string(nullable=False, description="the middle"),
            "stop": boolean(nullable=False),
            "model": string(nullable=False),
            "tokens_predicted": INTEGER,
            "tokens_evaluated": INTEGER,
            "tokens_cached": INTEGER,
            "truncated": boolean(nullable=False),
            "stop_type": enum(("eos", "limit", "word")),
            "stopping_word": string(nullable=False),
            "timings": obj(
                {
                    name: {"type": "number"}
                    for name in (
                        "prompt_n",
                        "prompt_ms",
                        "prompt_per_second",
                        "predicted_n",
                        "predicted_ms",
                        "predicted_per_second",
                    )
                },
                description="milliseconds as the connection saw them (queue wait included in prompt_ms)",
            ),
        },
        ("content", "stop", "tokens_predicted", "tokens_evaluated", "tokens_cached", "timings"),
        "llama.cpp's completion object, as /infill answers",
    ),
    "Tokens": obj(
        {
            "tokens": {
                "type": "array",
                "items": {
                    "anyOf": [
                        INTEGER,
                        obj(
                            {
                                "id": INTEGER,
                                "piece": {
                                    "anyOf": [
                                        string(nullable=False),
                                        {"type": "array", "items": INTEGER},
                                    ]
                                },
                            },
                            ("id", "piece"),
                        ),
                    ]
                },
            }
        },
        ("tokens",),
    ),
    "Detokenized": obj({"content": string(nullable=False)}, ("content",)),
    "Embeddings": obj(
        {
            "object": const("list"),
            "data": {
                "type": "array",
                "items": obj(
                    {
                        "object": const("embedding"),
                        "index": INTEGER,
                        "embedding": {
                            "anyOf": [{"type": "array", "items": {"type": "number"}}, string(nullable=False)]
                        },
                    },
                    ("object", "index", "embedding"),
                ),
            },
            "model": string(nullable=False),
            "usage": obj(
                {"prompt_tokens": INTEGER, "total_tokens": INTEGER}, ("prompt_tokens", "total_tokens")
            ),
        },
        ("object", "data", "model", "usage"),
    ),
    "OpenAIError": obj(
        {
            "error": obj(
                {
                    "message": string(nullable=False),
                    "type": string(nullable=False),
                    "param": NULLABLE_STRING,
                    "code": NULLABLE_STRING,
                },
                ("message", "type", "param", "code"),
            )
        },
        ("error",),
        "an error in the OpenAI dialects' envelope",
    ),
    "AnthropicError": obj(
        {
            "type": const("error"),
            "error": obj(
                {"type": string(nullable=False), "message": string(nullable=False)}, ("type", "message")
            ),
        },
        ("type", "error"),
        "an error in Anthropic's envelope",
    ),
    "ChatCompletion": obj(
        {
            "id": string(nullable=False),
            "object": const("chat.completion"),
            "created": INTEGER,
            "model": string(nullable=False),
            "choices": {
                "type": "array",
                "items": obj(
                    {
                        "index": INTEGER,
                        "message": obj(
                            {"role": const("assistant"), "content": NULLABLE_STRING}, ("role", "content")
                        ),
                        "finish_reason": enum(("stop", "length", "tool_calls")),
                    },
                    ("index", "message", "finish_reason"),
                ),
            },
            "usage": obj(
                {"prompt_tokens": INTEGER, "completion_tokens": INTEGER, "total_tokens": INTEGER},
                ("prompt_tokens", "completion_tokens", "total_tokens"),
            ),
        },
        ("id", "object", "created", "model", "choices", "usage"),
    ),
    "Response": obj(
        {
            "id": string(nullable=False),
            "object": const("response"),
            "status": string(nullable=False),
            "output": {"type": "array"},
            "usage": obj(
                {"input_tokens": INTEGER, "output_tokens": INTEGER}, ("input_tokens", "output_tokens")
            ),
        },
        ("id", "object", "status", "output"),
    ),
    "Message": obj(
        {
            "id": string(nullable=False),
            "type": const("message"),
            "role": const("assistant"),
            "content": {"type": "array"},
            "stop_reason": NULLABLE_STRING,
            "usage": obj(
                {"input_tokens": INTEGER, "output_tokens": INTEGER}, ("input_tokens", "output_tokens")
            ),
        },
        ("id", "type", "role", "content", "usage"),
    ),
    "Model": obj(
        {
            "id": string(nullable=False),
            "object": const("model"),
            "created": INTEGER,
            "owned_by": string(nullable=False),
            "max_model_len": {
                "type": "integer",
                "description": "the context served (--ctx), vLLM's name; absent while the model loads",
            },
            "capabilities": obj(
                {name: boolean(nullable=False) for name in CAPABILITY_NAMES},
                CAPABILITY_NAMES,
                "What the loaded model can do (absent while it loads)",
            ),
        },
        ("id", "object", "created", "owned_by"),
    ),
    "AnthropicModel": obj(
        {
            "type": const("model"),
            "id": string(nullable=False),
            "display_name": string(nullable=False),
            "created_at": string(nullable=False),
        },
        ("type", "id", "display_name", "created_at"),
    ),
    "Health": obj(
        {
            "status": string(nullable=False, description="ok when serving; loading, failed or stopping else"),
            "model": string(nullable=False),
            "queued": INTEGER,
            "in_flight": INTEGER,
            "connections": INTEGER,
            "tokens_generated": INTEGER,
            "experts": string(
                "a MoE model's routed experts: repack or borrow (--experts); null without experts",
                enum=["repack", "borrow", None],
            ),
            "capabilities": obj(
                {
                    **{name: {"type": "boolean"} for name in CAPABILITY_NAMES},
                    "ctx": {"type": ["integer", "null"]},
                    "kv_slots": INTEGER,
                },
                (*CAPABILITY_NAMES, "ctx", "kv_slots"),
            ),
            "sampling_defaults": {
                "type": "object",
                "description": "the server's sampling defaults (--temp, --top-k, ..., --seed) that are set, "
                "by request field name; what a request leaving the field out gets",
                "additionalProperties": {"type": "number"},
            },
        },
        ("status", "model", "queued", "in_flight", "connections", "tokens_generated"),
    ),
}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: Schema, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(envelope: str) -> dict:
    """Every 4xx and 5xx answer of an endpoint, in its dialect's envelope."""
    return {
        "4XX": _json(_ref(envelope), "a refused request (the message names the problem)"),
        "5XX": _json(_ref(envelope), "a failure (503 while loading or shutting down, with Retry-After)"),
    }


# Sent only when a fleet's composed KV prefix served the reply (api/consumers/generation.py).
DOCUMENTS_HEADER = {
    "x-lmserve-documents": {
        "description": "the fleet documents whose cartridges served this reply, comma-separated "
        "in selection order (only on a server started with --fleet)",
        "required": False,
        "schema": {"type": "string"},
    }
}


def _generation(summary: str, request: str, reply: str, envelope: str, stream: str) -> dict:
    ok = _json(_ref(reply), "the whole reply")
    ok["content"]["text/event-stream"] = {"schema": SSE_EVENT | {"description": stream}}
    ok["headers"] = DOCUMENTS_HEADER
    return {
        "post": {
            "summary": summary,
            "operationId": request.removesuffix("Request").lower(),
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {"200": ok, **_errors(envelope)},
        }
    }


def _post(summary: str, operation: str, request: str, reply: str, description: str) -> dict:
    """A POST endpoint answered with one JSON object (no stream)."""
    return {
        "post": {
            "summary": summary,
            "operationId": operation,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {"200": _json(_ref(reply), description), **_errors("OpenAIError")},
        }
    }


def _get(
    summary: str, operation: str, ok: dict, *, envelope: str = "OpenAIError", public: bool = False
) -> dict:
    get = {"summary": summary, "operationId": operation, "responses": {"200": ok, **_errors(envelope)}}
    if public:
        get["security"] = []
    return {"get": get}


def _paths() -> dict:
    models = _json(
        {
            "anyOf": [
                obj(
                    {"object": const("list"), "data": {"type": "array", "items": _ref("Model")}},
                    ("object", "data"),
                ),
                obj(
                    {
                        "data": {"type": "array", "items": _ref("AnthropicModel")},
                        "has_more": {"type": "boolean"},
                    },
                    ("data", "has_more"),
                ),
            ]
        },
        "the loaded model (Anthropic's paged shape to a request carrying anthropic-version)",
    )
    model = _json({"anyOf": [_ref("Model"), _ref("AnthropicModel")]}, "the loaded model")
    model_get = _get("The loaded model; 404 for any other id", "getModel", model)
    model_get["get"]["parameters"] = [
        {"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}
    ]
    text = {"description": "text", "content": {"text/plain": {"schema": {"type": "string"}}}}
    return {
        "/v1/chat/completions": _generation(
            "OpenAI Chat Completions",
            "ChatCompletionRequest",
            "ChatCompletion",
            "OpenAIError",
            "chat.completion.chunk data frames, then data: [DONE]",
        ),
        "/v1/responses": _generation(
            "OpenAI Responses (stateless)",
            "ResponsesRequest",
            "Response",
            "OpenAIError",
            "named Responses events",
        ),
        "/v1/completions": _generation(
            "OpenAI (legacy) Completions: a raw prompt, no chat template",
            "CompletionRequest",
            "TextCompletion",
            "OpenAIError",
            "text_completion data frames, then data: [DONE]",
        ),
        "/infill": _generation(
            "llama.cpp's fill-in-the-middle (llama.vscode and other editors)",
            "InfillRequest",
            "Infill",
            "OpenAIError",
            "data frames {content, stop: false}, then the Infill object with stop: true",
        ),
        "/tokenize": _post("llama.cpp's tokenizer", "tokenize", "TokenizeRequest", "Tokens", "the token ids"),
        "/detokenize": _post(
            "llama.cpp's detokenizer (ids outside the vocabulary: 400 naming them)",
            "detokenize",
            "DetokenizeRequest",
            "Detokenized",
            "the text",
        ),
        "/v1/messages": _generation(
            "Anthropic Messages", "MessagesRequest", "Message", "AnthropicError", "named Messages events"
        ),
        "/v1/embeddings": {
            "post": {
                "summary": "OpenAI Embeddings (one unit vector per input)",
                "operationId": "embeddings",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("EmbeddingsRequest")}},
                },
                "responses": {"200": _json(_ref("Embeddings"), "the vectors"), **_errors("OpenAIError")},
            }
        },
        "/v1/messages/count_tokens": {
            "post": {
                "summary": "Tokens the prompt of a Messages request takes",
                "operationId": "countTokens",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("CountTokensRequest")}},
                },
                "responses": {
                    "200": _json(obj({"input_tokens": INTEGER}, ("input_tokens",)), "the count"),
                    **_errors("AnthropicError"),
                },
            }
        },
        "/v1/models": _get("The loaded model, as a list", "listModels", models),
        "/v1/models/{model_id}": model_get,
        "/health": _get(
            "Readiness and load (503 while loading)", "health", _json(_ref("Health"), "ready"), public=True
        ),
        "/metrics": _get("Prometheus metrics (open by default: --metrics)", "metrics", text, public=True),
        "/openapi.json": _get(
            "This document", "openapi", _json({"type": "object"}, "OpenAPI 3.1"), public=True
        ),
    }


def build_document(version: str = "1") -> dict:
    """The OpenAPI 3.1 document (every API path also answers without its ``/v1`` prefix)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "lmserve",
            "version": version,
            "description": "A local language-model server speaking OpenAI Chat Completions, OpenAI "
            "Responses and Anthropic Messages, with OpenAI's legacy Completions and llama.cpp's "
            "/infill, /tokenize and /detokenize. Every /v1 path also answers without the prefix.",
        },
        "paths": _paths(),
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "--api-key"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key", "description": "--api-key"},
            },
        },
        "security": [{"bearer": []}, {"apiKey": []}, {}],
    }
