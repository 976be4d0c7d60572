"""The FFN's activation of a tile of gate and up values (step_kernels.ffn_stage), in loops LLVM
vectorizes: out = SiLU(gate) * up or GELU(gate) * up, each value bit for bit the scalar
form's (layers.silu_one, rowops.gelu_lookup).

The scalar forms branch per value (silu_one between ggml's vector expf and libm's, gelu_lookup
on its range and f16_bits on subnormals) and numba's float division checks for zero, so their
loops ran one value at a time: ~10% of a 16-token prefill's CPU time on Qwen2.5, ~6% on Gemma 3.
Here both sides of each branch are computed and one selected, and the division is IEEE's
(``error_model="numpy"``, no check).
"""

from __future__ import annotations

import numba
import numpy as np

from ..ggml_math import expf_ggml
from ..layers import silu_one
from .kernels import F16_MIN_NORMAL, F16_SUBNORMAL_STEP


@numba.njit(cache=True, error_model="numpy")
def silu_mul(gate, up, out, vector_end):
    """out[i] = SiLU(gate[i]) * up[i] for i < out.shape[0]; the first ``vector_end`` as ggml's
    8-wide blocks compute them (silu_one's vector lanes), the rest with libm's expf."""
    for i in range(vector_end):
        g = gate[i]
        out[i] = g / (np.float32(1.0) + expf_ggml(np.float32(0.0) - g)) * up[i]
    for i in range(vector_end, out.shape[0]):
        out[i] = silu_one(gate[i], False) * up[i]


@numba.njit(cache=True, inline="always")
def _f16_index(v, b):
    """kernels.f16_bits(v, b) as a table index, without a branch: both roundings computed
    (the subnormal one of min(|v|, F16_MIN_NORMAL), always in range), one selected. Any v
    (NaN, |v| >= 65504 too) gives an index below 65536, the one f16_bits gives where it applies."""
    sign = (b >> np.uint32(16)) & np.uint32(0x8000)
    magnitude = abs(v)
    small = np.uint32(np.rint(min(magnitude, F16_MIN_NORMAL) / F16_SUBNORMAL_STEP))
    r = (b & np.uint32(0x7FFFFFFF)) + np.uint32(0xFFF) + ((b >> np.uint32(13)) & np.uint32(1))
    exponent = (r >> np.uint32(23)) - np.uint32(112)  # rebias 127 -> 15
    normal = (exponent << np.uint32(10)) | ((r >> np.uint32(13)) & np.uint32(0x3FF))
    return (sign | (small if magnitude < F16_MIN_NORMAL else normal)) & np.uint32(0xFFFF)


@numba.njit(cache=True, error_model="numpy")
def gelu_mul(gate, up, out, table):
    """out[i] = gelu_lookup(gate[i]) * up[i] for i < out.shape[0] (table: rowops.gelu_table)."""
    bits = gate.view(np.uint32)
    for i in range(out.shape[0]):
        v = gate[i]
        looked = table[_f16_index(v, bits[i])]
        value = np.float32(0.0) if v <= np.float32(-10.0) else (v if v >= np.float32(10.0) else looked)
        out[i] = value * up[i]
