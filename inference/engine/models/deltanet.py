"""The gated DeltaNet recurrence of Qwen3.5's linear-attention layers, and the cache that holds
its state beside the KV rows of the full-attention layers.

A linear-attention layer keeps, per conversation, two things instead of KV rows: the last
``d_conv - 1`` inputs of its causal depthwise convolution (``conv``), and one state matrix per
value head (``ssm``, (head_k, head_v)) that the delta rule updates token after token. Neither
can be cut back to an earlier token: a request either continues the state or starts from zero
(:class:`HybridCache`). The steps follow llama.cpp's graph (``delta-net-base.cpp``,
``ggml_ssm_conv``, ``ggml_gated_delta_net``): the state decays by ``exp(g)``, takes the rank-1
correction ``k (beta (v - S^T k))^T``, and the output is ``S^T q / sqrt(head_k)``.

The state is held key-major, the transpose of llama.cpp's layout, so that the numba kernel
(fused/delta_rule.py) updates contiguous rows element-wise and sums over the key index in one
fixed order, vectorized without reassociation. The delta rule runs token after token in prefill
and decode alike (as llama.cpp's CPU op does), so a token's result never depends on how many
rows ran with it. The convolution stays numpy: a few multiply-adds per channel, about 2% of a
prefill of the synthetic files against the recurrence's 25% before the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..fused.delta_rule import delta_rule_heads
from ..kv_cache import KVCache, KVGeometry
from .layers import rms_norm

ONES = np.float32(1.0)


@dataclass(frozen=True)
class DeltaNetShape:
    """The geometry of a linear-attention layer (GGUF ``ssm.*`` keys)."""

    n_k_heads: int  # ssm.group_count
    n_v_heads: int  # ssm.time_step_rank
    head_k: int  # ssm.state_size
    head_v: int  # ssm.inner_size / n_v_heads
    d_conv: int  # ssm.conv_kernel

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.head_k

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.head_v

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: q, k and v side by side."""
        return 2 * self.key_dim + self.value_dim


class RecurrentState:
    """The conv inputs and delta-rule matrices of every linear-attention layer of one
    conversation, zero at the start."""

    def __init__(self, shape: DeltaNetShape, n_layers: int):
        s = shape
        self.shape = shape
        self.conv = np.zeros((n_layers, s.conv_dim, s.d_conv - 1), np.float32)  # (L, conv_dim, d_conv-1)
        self.ssm = np.zeros(
            (n_layers, s.n_v_heads, s.head_k, s.head_v), np.float32
        )  # (L, Hv, head_k, head_v)

    def reset(self) -> None:
        self.conv[:] = 0.0
        self.ssm[:] = 0.0

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes


class HybridCache(KVCache):
    """KV rows for the full-attention layers plus the recurrent state of the linear ones.

    Token bookkeeping is KVCache's. The recurrent state summarises every token so far, so the
    cache can only be kept whole or emptied: ``truncate`` to the current length is a no-op, to
    zero a reset, and anything else is refused; ``common_prefix`` is all cached tokens when a
    prompt continues them and 0 otherwise (so ``Engine.reuse_prefix`` either runs on or starts
    again from an empty cache)."""

    def __init__(self, geometry: KVGeometry, n_ctx: int, shape: DeltaNetShape, n_linear: int):
        super().__init__(geometry, n_ctx)
        self.recurrent = RecurrentState(shape, n_linear)

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.recurrent.nbytes

    def truncate(self, n: int) -> None:
        if n == self.n_tokens:
            return
        if n != 0:
            raise ValueError(
                f"a recurrent (DeltaNet) cache cannot be cut back to {n} of its {self.n_tokens} tokens"
            )
        super().truncate(0)
        self.recurrent.reset()

    def common_prefix(self, tokens: list[int]) -> int:
        """The cached tokens if ``tokens`` continues them (the state then runs on), else 0: a
        shorter match is of no use, since the state cannot be cut back to it."""
        n = self.n_tokens
        return n if len(tokens) > n and super().common_prefix(tokens) == n else 0

    def install_prefix(self, prefix, key: str = "") -> None:
        if prefix is not None:
            raise ValueError("a recurrent (DeltaNet) model cannot run behind a KV prefix")
        super().install_prefix(None, key)
        self.recurrent.reset()

    def copy_rows_from(self, other: KVCache, n: int) -> None:
        raise ValueError("a recurrent (DeltaNet) cache cannot share rows with another cache")


# -- the steps of one linear-attention layer ---------------------------------------------------


def causal_conv(x: np.ndarray, state: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """The depthwise causal convolution of x (n, channels) after the ``state`` inputs
    (channels, d_conv-1), as ggml_ssm_conv sums it (taps in order, float32); ``state`` becomes
    the last d_conv-1 inputs. weight: (channels, d_conv)."""
    n, d_conv = x.shape[0], weight.shape[1]
    window = np.concatenate([state, x.T], axis=1)  # (channels, d_conv-1+n)
    out = window[:, 0:n] * weight[:, 0:1]  # (channels, n)
    for tap in range(1, d_conv):
        out = out + window[:, tap : tap + n] * weight[:, tap : tap + 1]
    state[:] = window[:, n:]
    return np.ascontiguousarray(out.T)  # (n, channels)


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(sum(x^2) + eps) over the last axis, as llama.cpp builds it: an RMS norm with
    eps / n, times 1 / sqrt(n)."""
    n = x.shape[-1]
    return rms_norm(x, ONES, eps / n) * np.float32(1.0 / np.sqrt(np.float32(n)))


def softplus(x: np.ndarray) -> np.ndarray:
    """logf(1 + expf(x)) in float32, x itself above 20 (ggml_compute_softplus_f32)."""
    x = np.asarray(x, np.float32)
    return np.where(x > 20.0, x, np.log(ONES + np.exp(np.minimum(x, np.float32(20.0))))).astype(np.float32)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return (ONES / (ONES + np.exp(-np.asarray(x, np.float32)))).astype(np.float32)


def delta_rule(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray
) -> np.ndarray:
    """The gated delta rule over n tokens, updating ``state`` (Hv, head_k, head_v) in place:
    the numba kernel (fused/delta_rule.py), bit for bit :func:`delta_rule_reference`.

    q, k: (n, Hk, head_k), l2-normed; v: (n, Hv, head_v); g (log decay) and beta: (n, Hv).
    Returns (n, Hv, head_v)."""
    n, n_v, head_v = q.shape[0], state.shape[0], state.shape[2]
    # exp in numpy, as the reference takes it (numba's would be libm's expf, which may round
    # differently); numpy's float32 exp gives each element the same bits in a run of any length.
    decay = np.exp(np.asarray(g, np.float32))  # (n, Hv)
    out = np.empty((n, n_v, head_v), np.float32)  # (n, Hv, head_v)
    delta_rule_heads(
        np.ascontiguousarray(q, np.float32),
        np.ascontiguousarray(k, np.float32),
        np.ascontiguousarray(v, np.float32),
        decay,
        np.ascontiguousarray(beta, np.float32),
        delta_rule_scale(state),
        state,
        out,
    )
    return out


def delta_rule_scale(state: np.ndarray) -> np.float32:
    """1 / sqrt(head_k) in float32, the output's scale."""
    return np.float32(1.0 / np.sqrt(np.float32(state.shape[1])))


def delta_rule_reference(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray
) -> np.ndarray:
    """:func:`delta_rule` in numpy, the numba kernel's reference: the same float32 operations
    in the same order (each sum over the key index i taken in index order, one product at a
    time), so the two agree to the bit.

    Value head h reads key head h % Hk (llama.cpp tiles the key heads). Per token, with S
    (head_k, head_v) per value head: S *= exp(g); d = beta (v - S^T k); S += k d^T;
    out = S^T q / sqrt(head_k). Returns (n, Hv, head_v)."""
    n, n_k = q.shape[0], q.shape[1]
    n_v, head_k, head_v = state.shape
    heads = np.arange(n_v) % n_k
    scale = delta_rule_scale(state)
    decay = np.exp(np.asarray(g, np.float32))  # (n, Hv)
    out = np.empty((n, n_v, head_v), np.float32)  # (n, Hv, head_v)
    for t in range(n):
        qt, kt = q[t, heads], k[t, heads]  # (Hv, head_k)
        state *= decay[t][:, None, None]
        recalled = np.zeros((n_v, head_v), np.float32)  # (Hv, head_v)
        for i in range(head_k):
            recalled += state[:, i, :] * kt[:, i, None]
        delta = (v[t] - recalled) * beta[t][:, None]  # (Hv, head_v)
        state += kt[:, :, None] * delta[:, None, :]
        acc = np.zeros((n_v, head_v), np.float32)  # (Hv, head_v)
        for i in range(head_k):
            acc += state[:, i, :] * qt[:, i, None]
        out[t] = acc * scale
    return out
