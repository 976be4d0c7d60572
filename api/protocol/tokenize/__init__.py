"""llama.cpp's POST /tokenize and POST /detokenize: request parsers and answers."""

from .request import DetokenizeRequest, TokenizeRequest, detokenize, tokenize

__all__ = ["DetokenizeRequest", "TokenizeRequest", "detokenize", "tokenize"]
