"""Quantized weight matrices: GGUF block formats repacked at load time for fast numba kernels.

    m = load_matrix(tensor.type, tensor.data, tensor.shape, tensor.name)
    y = m.matvec(x)        # decode: W @ x
    Y = m.matmul(X)        # prefill: X @ W.T
    E = m.take_rows(ids)   # embedding lookup

Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
Dequantized values are bitwise equal to ``gguf.quants.dequantize``.
"""

import os

# numba's parallel kernels run on libgomp, whose idle threads spin ~300k iterations before
# sleeping. When another process holds a core (a web server thread, a test run), a spinning
# thread waits for one that is descheduled, and every parallel region costs a time slice:
# decode fell from 13 to 0.5 tok/s on a busy 2-core machine. Sleeping at once is robust; set
# OMP_WAIT_POLICY=ACTIVE on a dedicated machine to spin instead. (Read when libgomp loads, at
# the first parallel kernel call, so it must be set before.)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .matrix import SUPPORTED_TYPES, FloatMatrix, GroupedMatrix, QuantMatrix, load_matrix

__all__ = ["SUPPORTED_TYPES", "FloatMatrix", "GroupedMatrix", "QuantMatrix", "load_matrix"]
