"""A numpy reference for the integer group dot products, bit for bit (intdot.py's kernels).

intdot.dot_row_reference checks the value within a rounding bound; this one reproduces the
kernels' float32 bits, so every instruction selection (simd.py) can be held to it exactly:
per group the exact int32 lanes as ggml folds them (lane j sums the group's products
j * G/8 .. (j + 1) * G/8 - 1), converted to float32, times fl(scale * code scale), added to
the lane's accumulator with one rounding (a fused multiply-add, done here in exact rational
arithmetic), and the 8 lanes summed in ggml's hsum_float_8 order. Slow: for tests.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

LANES = 8


def group_lanes_reference(q: np.ndarray, ints: np.ndarray, group: int) -> np.ndarray:
    """int8 codes q, ints (cols,) -> the int32 lanes of every group (groups, LANES) int64."""
    products = q.astype(np.int64) * ints.astype(np.int64)  # (cols,)
    return products.reshape(-1, LANES, group // LANES).sum(axis=2)  # (groups, LANES)


def round_to_float32(x: Fraction) -> np.float32:
    """x correctly rounded to float32, ties to even (no double rounding through float64)."""
    near = np.float32(float(x))
    candidates = [np.nextafter(near, np.float32(-np.inf)), near, np.nextafter(near, np.float32(np.inf))]
    distances = [abs(Fraction(float(c)) - x) for c in candidates]
    best = min(distances)
    ties = [c for c, d in zip(candidates, distances, strict=True) if d == best]
    return min(ties, key=lambda c: int(np.array(c, np.float32).view(np.uint32)) & 1)


def fma_float32(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    """a * b + c rounded once to float32."""
    return round_to_float32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))


def hsum_float_8(lanes: list[np.float32]) -> np.float32:
    """ggml's order: ((x4 + x0) + (x6 + x2)) + ((x5 + x1) + (x7 + x3)), each add in float32."""
    r = [np.float32(lanes[4 + i] + lanes[i]) for i in range(4)]
    return np.float32(np.float32(r[0] + r[2]) + np.float32(r[1] + r[3]))


def dot_row_bitwise_reference(
    q: np.ndarray, ints: np.ndarray, scales: np.ndarray, int_scales: np.ndarray
) -> np.float32:
    """One row's q (cols,) int8 against ints (cols,) int8 with per-group float32 scales and
    code scales (groups,) -> the float32 the kernels return."""
    group = q.shape[0] // scales.shape[0]
    lanes = group_lanes_reference(q, ints, group)  # (groups, LANES)
    acc = [np.float32(0.0)] * LANES
    for g in range(scales.shape[0]):
        factor = np.float32(np.float32(scales[g]) * np.float32(int_scales[g]))
        acc = [fma_float32(np.float32(lanes[g, j]), factor, acc[j]) for j in range(LANES)]
    return hsum_float_8(acc)
