"""The FFN's vectorized activations (fused/ffn_act.py) against the scalar forms they replace,
bit for bit, over every kind of float32 input: the f16 table's whole range (subnormal and
normal f16 values and their float32 neighbours), the +-10 edges of the GELU lookup, huge
values, infinities and NaN, random bit patterns; SiLU in ggml's vector lanes and the tail."""

from __future__ import annotations

import numpy as np
import pytest

from inference.engine.fused.ffn_act import gelu_mul, silu_mul
from inference.engine.fused.rowops import gelu_lookup, gelu_table, silu_one
from inference.engine.models.layers import silu


def _inputs() -> np.ndarray:
    """float32 values that reach every branch of the scalar forms (n,)."""
    rng = np.random.default_rng(15)
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    bits = halves.view(np.uint32)
    neighbours = np.concatenate([bits - 1, bits + 1, bits + 0xFFF, bits + 0x1000]).view(np.float32)
    near_ten = [np.nextafter(-10, 0), np.nextafter(10, 0)]
    edges = np.array([-10, 10, *near_ten, 65504, 65520, 1e30, -1e30], np.float32)
    special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 2.0**-14, 2.0**-24, 2.0**-25], np.float32)
    random_bits = rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    spread = (rng.standard_normal(1 << 16) * np.float32(4)).astype(np.float32)
    return np.concatenate([halves, neighbours, edges, special, random_bits, spread]).astype(np.float32)


def test_gelu_mul_equals_the_table_lookup_per_value():
    gate = _inputs()
    up = np.random.default_rng(1).standard_normal(gate.size).astype(np.float32)  # (n,)
    table = gelu_table()
    out = np.empty_like(gate)
    gelu_mul(gate, up, out, table)
    bits = gate.view(np.uint32)
    looked = np.array([gelu_lookup(g, b, table) for g, b in zip(gate, bits, strict=True)], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # huge values times up: inf, as in the kernel
        expected = looked * up
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("vector_end", [0, 8, 4864])
def test_silu_mul_equals_silu_one_per_value(vector_end):
    rng = np.random.default_rng(vector_end)
    gate = np.concatenate([_inputs()[:4000], (rng.standard_normal(1000) * 30).astype(np.float32)])
    up = rng.standard_normal(gate.size).astype(np.float32)  # (n,)
    out = np.empty_like(gate)
    silu_mul(gate, up, out, vector_end)
    lanes = [silu_one(g, i < vector_end) for i, g in enumerate(gate)]
    expected = np.array(lanes, np.float32) * up
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))


def test_silu_mul_matches_the_numpy_facing_silu():
    """A row of whole 8-wide blocks plus a tail, as layers.silu (llama.cpp's SwiGLU) gives it."""
    gate = (np.random.default_rng(3).standard_normal(4867) * 6).astype(np.float32)  # (4867,)
    up = np.ones_like(gate)
    out = np.empty_like(gate)
    silu_mul(gate, up, out, gate.size - gate.size % 8)
    np.testing.assert_array_equal(out, silu(gate[None])[0])
