"""The API's URL paths as regexes, named once: routing pairs each with its consumer, and the
metrics label a request by the path it matched (without importing the consumers)."""

CHAT_COMPLETIONS = r"^(?:v1/)?chat/completions/?$"
COMPLETIONS = r"^(?:v1/)?completions/?$"
RESPONSES = r"^(?:v1/)?responses/?$"
EMBEDDINGS = r"^(?:v1/)?embeddings/?$"
MESSAGES = r"^(?:v1/)?messages/?$"
COUNT_TOKENS = r"^(?:v1/)?messages/count_tokens/?$"
MODELS = r"^(?:v1/)?models/?$"
MODEL = r"^(?:v1/)?models/(?P<model_id>.+?)/?$"
HEALTH = r"^(?:v1/)?health/?$"
# llama.cpp's own endpoints, at llama-server's paths.
INFILL = r"^infill/?$"
TOKENIZE = r"^tokenize/?$"
DETOKENIZE = r"^detokenize/?$"
METRICS = r"^metrics/?$"
OPENAPI = r"^openapi\.json$"

API_PATHS = (
    CHAT_COMPLETIONS,
    COMPLETIONS,
    RESPONSES,
    EMBEDDINGS,
    MESSAGES,
    COUNT_TOKENS,
    MODELS,
    MODEL,
    HEALTH,
    INFILL,
    TOKENIZE,
    DETOKENIZE,
    METRICS,
    OPENAPI,
)
