"""The Anthropic Messages dialect: request parsing, encoders, tools."""

from .encoder import MessagesEncoder
from .request import MessagesRequest

__all__ = ["MessagesEncoder", "MessagesRequest"]
