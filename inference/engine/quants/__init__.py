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
# sleeping. When another process holds a core (a test run, the web server's threads), a
# spinning thread waits for one that is descheduled and every parallel region can cost a time
# slice: decode fell to 0.5 tok/s at load 6 on a 2-core machine (8 tok/s with a 10k spin at
# load 3), against 13-47 tok/s sleeping at once (PASSIVE). On a quiet machine spinning is
# about twice as fast in decode (90-97 against 48 tok/s at load ~1.5): a dedicated server
# should set OMP_WAIT_POLICY=ACTIVE (or GOMP_SPINCOUNT). Any value the user set wins. (libgomp
# reads these when it loads, at the first parallel kernel call.)
if "GOMP_SPINCOUNT" not in os.environ:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .matrix import SUPPORTED_TYPES, FloatMatrix, GroupedMatrix, QuantMatrix, load_matrix

__all__ = ["SUPPORTED_TYPES", "FloatMatrix", "GroupedMatrix", "QuantMatrix", "load_matrix"]
