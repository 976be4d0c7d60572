"""How the engine's numba kernels are compiled, cached and dispatched: the workarounds for what
numba does not do (or does too slowly) on its own, and LLVM operations it does not offer.
README.md says why each exists. Nothing here knows a model or a block format."""
