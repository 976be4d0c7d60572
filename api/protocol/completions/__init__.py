"""OpenAI (legacy) Completions: the request parser and the text_completion encoder."""

from .encoder import CompletionsEncoder
from .request import CompletionRequest

__all__ = ["CompletionRequest", "CompletionsEncoder"]
