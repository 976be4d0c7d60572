"""The OpenAI Chat Completions dialect: request parsing, encoders, tools."""

from .encoder import ChatEncoder
from .request import ChatCompletionRequest

__all__ = ["ChatCompletionRequest", "ChatEncoder"]
