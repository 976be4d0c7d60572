"""llama.cpp's POST /infill (fill-in-the-middle for editors): the request parser and encoder."""

from .encoder import InfillEncoder
from .request import InfillRequest

__all__ = ["InfillEncoder", "InfillRequest"]
