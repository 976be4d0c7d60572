"""Quantized weight matrices: GGUF block formats repacked at load time for fast numba kernels.

    m = load_matrix(tensor.type, tensor.data, tensor.shape, tensor.name)
    y = m.matvec(x)        # decode: W @ x
    Y = m.matmul(X)        # prefill: X @ W.T
    E = m.take_rows(ids)   # embedding lookup

Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, TQ1_0,
TQ2_0.
Dequantized values are bitwise equal to ``gguf.quants.dequantize``.
"""

import os

# numba's parallel kernels run on libgomp, whose idle threads spin ~300k iterations before
# sleeping. When another process holds a core (a test run, the web server's threads), a
# spinning thread waits for one that is descheduled: decode fell to 0.5 tok/s at load 6 on a
# 2-core machine when every product was its own parallel region. Since a decode step is one
# region (fused/fused.py) sleeping at once costs one wake-up per token: PASSIVE and ACTIVE
# measured the same (82-87 tok/s on SmolLM2). Any value the user set wins. (libgomp reads
# these when it loads, at the first parallel kernel call.)
if "GOMP_SPINCOUNT" not in os.environ:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .matrix import SUPPORTED_TYPES, FloatMatrix, GroupedMatrix, QuantMatrix, load_matrix

__all__ = ["SUPPORTED_TYPES", "FloatMatrix", "GroupedMatrix", "QuantMatrix", "load_matrix"]
