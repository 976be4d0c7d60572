"""The inference engine: GGUF files, tokenizers, quantized kernels and the forward pass.

Importing the package first points numba's disk cache at a directory keyed by this CPU and
this engine's sources (numba_cache.py), before any kernel is defined.
"""

from .numba_cache import use_keyed_cache_dir

use_keyed_cache_dir()
