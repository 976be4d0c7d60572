"""The inference engine: GGUF files, tokenizers, quantized kernels and the forward pass.

Importing the package (or any module in it) reads and writes nothing on disk. It only tells
numba, in memory, where a ``cache=True`` kernel's compiled code belongs (jit/numba_cache.py):
numba decides that when the kernel is defined, so it must know before any kernel module runs.
The directory itself is created by ``Engine.load`` and the commands.
"""

from .jit.numba_cache import install_cache_locator

install_cache_locator()
