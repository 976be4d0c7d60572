"""The OpenAI Responses dialect: request parsing, encoders, tools."""

from .encoder import ResponsesEncoder
from .request import ResponsesRequest

__all__ = ["ResponsesEncoder", "ResponsesRequest"]
