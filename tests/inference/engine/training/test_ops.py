"""Each training op's backward against central finite differences, in float64."""

from __future__ import annotations

import numpy as np
import pytest

from inference.engine.models.layers import rope_angles
from inference.engine.training import ops

RNG = np.random.default_rng(7)
EPS = 1e-6


def numeric_grad(f, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """d/dx of sum(f(x) * dy), by central differences at every coordinate."""
    grad = np.zeros_like(x)
    flat, g = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + EPS
        plus = np.sum(f(x) * dy)
        flat[i] = keep - EPS
        minus = np.sum(f(x) * dy)
        flat[i] = keep
        g[i] = (plus - minus) / (2 * EPS)
    return grad


def close(a, b, rtol=1e-6):
    scale = max(np.abs(b).max(), 1e-12)
    assert np.abs(a - b).max() <= rtol * scale, (np.abs(a - b).max(), scale)


def test_rms_norm_backward():
    x, w = RNG.normal(size=(3, 2, 8)), RNG.normal(size=8)
    dy = RNG.normal(size=x.shape)
    _, inv = ops.rms_norm(x, w, 1e-6)
    close(ops.rms_norm_backward(dy, x, w, inv), numeric_grad(lambda t: ops.rms_norm(t, w, 1e-6)[0], x, dy))


@pytest.mark.parametrize("neox", [False, True])
def test_rope_backward_is_the_inverse_rotation(neox):
    x = RNG.normal(size=(4, 3, 16))
    cos, sin = (a.astype(np.float64) for a in rope_angles(np.arange(9, 13), 12, 10000.0))  # partial rotary
    dy = RNG.normal(size=x.shape)
    back = ops.rope(dy, cos, sin, neox, inverse=True)
    close(back, numeric_grad(lambda t: ops.rope(t, cos, sin, neox), x, dy))
    close(ops.rope(ops.rope(x, cos, sin, neox), cos, sin, neox, inverse=True), x, 1e-6)  # f32 angles
    assert np.array_equal(ops.rope(x, cos, sin, neox)[..., 12:], x[..., 12:])


def test_rope_matches_the_engine_rotation():
    from inference.engine.models.layers import ROPE_NEOX, ROPE_NORM, apply_rope

    x = RNG.normal(size=(5, 2, 8)).astype(np.float32)
    cos, sin = rope_angles(np.arange(3, 8), 8, 10000.0)
    for style in (ROPE_NORM, ROPE_NEOX):
        close(ops.rope(x, cos, sin, style == ROPE_NEOX), apply_rope(x, cos, sin, style), 1e-6)


@pytest.mark.parametrize("window", [0, 4])
def test_attention_with_prefix_backward(window):
    heads, kvh, n, rows, d = 4, 2, 3, 5, 6
    q = RNG.normal(size=(heads, n, d))
    k, v = RNG.normal(size=(kvh, rows + n, d)), RNG.normal(size=(kvh, rows + n, d))
    mask = ops.attention_mask(n, rows, window)
    dy = RNG.normal(size=(heads, n, d))
    _, probs = ops.attention(q, k, v, mask, 0.4)
    dq, dk, dv = ops.attention_backward(dy, q, k, v, probs, 0.4)
    close(dq, numeric_grad(lambda t: ops.attention(t, k, v, mask, 0.4)[0], q, dy))
    close(dk, numeric_grad(lambda t: ops.attention(q, t, v, mask, 0.4)[0], k, dy))
    close(dv, numeric_grad(lambda t: ops.attention(q, k, t, mask, 0.4)[0], v, dy))
    if window:  # rows outside every query's window get no gradient
        assert np.all(dk[:, : rows + n - window - 2] == 0)


def test_attention_mask_sees_the_whole_prefix_and_the_past():
    mask = ops.attention_mask(2, 3, 0)
    assert mask.tolist() == [[False] * 4 + [True], [False] * 5]
    assert ops.attention_mask(1, 3, 2).tolist() == [[True, True, False, False]]


@pytest.mark.parametrize(
    "forward, backward", [(ops.swiglu, ops.swiglu_backward), (ops.geglu, ops.geglu_backward)]
)
def test_gated_units_backward(forward, backward):
    gate, up = RNG.normal(size=(3, 7)) * 3, RNG.normal(size=(3, 7))
    dy = RNG.normal(size=gate.shape)
    dgate, dup = backward(dy, gate, up)
    close(dgate, numeric_grad(lambda t: forward(t, up), gate, dy))
    close(dup, numeric_grad(lambda t: forward(gate, t), up, dy))


def test_geglu_is_the_engines_gelu_up_to_f16_rounding():
    from inference.engine.models.layers import gelu_tanh

    x = np.linspace(-6, 6, 101).astype(np.float32)
    assert np.abs(ops.gelu_tanh(x) - gelu_tanh(x)).max() < 1e-2


def test_softcap_backward():
    x, dy = RNG.normal(size=(4, 5)) * 40, RNG.normal(size=(4, 5))
    numeric = numeric_grad(lambda t: ops.softcap(t, 30.0), x, dy)
    close(ops.softcap_backward(dy, ops.softcap(x, 30.0), 30.0), numeric)


def test_teacher_targets_keep_the_top_k_up_to_the_mass():
    from inference.engine.training.distill import teacher_targets

    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05], [0.97, 0.01, 0.01, 0.01]]))
    t = teacher_targets(logits, k=3, mass=0.9)
    assert t.ids.tolist() == [[0, 1, 2], [0, 1, 2]]
    np.testing.assert_allclose(t.probs, [[0.5, 0.3, 0.15], [0.97, 0, 0]], rtol=1e-6)


def test_distill_loss_gradient():
    from inference.engine.training.distill import TeacherTargets, distill_loss

    logits = RNG.normal(size=(3, 9))
    targets = TeacherTargets(
        np.array([[1, 4], [0, 8], [2, 3]]), np.array([[0.6, 0.3], [0.9, 0.0], [0.5, 0.5]])
    )
    loss, grad = distill_loss(logits, targets)
    numeric = numeric_grad(lambda z: np.array(distill_loss(z, targets)[0]), logits, np.array(1.0))
    close(grad, numeric)
    z = logits - logits.max(-1, keepdims=True)
    logq = z - np.log(np.exp(z).sum(-1, keepdims=True))
    expected = (
        -(0.6 * logq[0, 1] + 0.3 * logq[0, 4] + 0.9 * logq[1, 0] + 0.5 * logq[2, 2] + 0.5 * logq[2, 3]) / 3
    )
    assert abs(loss - expected) < 1e-12
