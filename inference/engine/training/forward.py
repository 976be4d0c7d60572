"""The training forward: tokens after a trainable KV prefix -> logits, and its backward to the
prefix's keys and values.

The prefix's keys are stored as the cache stores them (normed and rotated at their own rows),
so they enter attention as they are; the tokens sit at positions ``rows ..``. Every query sees
every prefix row (within a sliding window, on the layers that have one) and the tokens up to
itself. With ``checkpoint`` the forward keeps only each layer's input and the backward
recomputes the layer's activations just before it needs them: memory holds one layer's
activations instead of all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..models.base import DecoderModel
from ..models.layers import rope_angles
from . import ops
from .weights import LayerParams, TrainingWeights, training_weights


@dataclass
class LayerSaved:
    """What a layer's backward needs from its forward."""

    x: np.ndarray
    h: np.ndarray
    inv_attn: np.ndarray
    q: np.ndarray
    k: np.ndarray
    inv_q: np.ndarray | None
    inv_k: np.ndarray | None
    q_rot: np.ndarray  # (heads, n, d)
    keys: np.ndarray  # (kvh, rows + n, d): prefix then tokens
    values: np.ndarray
    probs: np.ndarray
    o: np.ndarray
    inv_post_attn: np.ndarray | None
    x1: np.ndarray
    h2: np.ndarray
    inv_ffn: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    f: np.ndarray
    inv_post_ffn: np.ndarray | None


@dataclass
class Tape:
    """A forward's record for its backward: per layer either the saved activations or (in the
    checkpointed mode) only the layer's input."""

    prefix_k: np.ndarray
    prefix_v: np.ndarray
    head_rows: np.ndarray
    cos: np.ndarray  # (tables, n, n_rot/2): one table per RoPE base
    sin: np.ndarray
    base_index: dict[float, int]
    layer_inputs: list[np.ndarray] = field(default_factory=list)
    saved: list[LayerSaved] = field(default_factory=list)
    final: np.ndarray | None = None  # the last layer's output rows the head reads
    inv_final: np.ndarray | None = None


def _heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    return x.reshape(x.shape[0], n_heads, -1)  # (n, heads, d)


def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    y = x @ w.T
    return y if b is None else y + b


class PrefixForward:
    """The float32 forward and backward of one model behind a trainable prefix."""

    def __init__(self, model: DecoderModel, weights: TrainingWeights | None = None):
        self.model = model
        self.w = weights or training_weights(model)

    def forward(
        self,
        tokens: Sequence[int],
        prefix_k: np.ndarray,
        prefix_v: np.ndarray,
        head_rows: Sequence[int] | None = None,
        checkpoint: bool = False,
    ) -> tuple[np.ndarray, Tape]:
        """Logits (len(head_rows), vocab) of the token rows ``head_rows`` (default: all) after
        the prefix k, v (n_layers, kv_heads, rows, head_dim), and the tape for ``backward``.
        The arithmetic follows the prefix's dtype (float32, or float64 for checks)."""
        dtype = prefix_k.dtype
        n, rows = len(tokens), prefix_k.shape[2]
        rows_idx = np.arange(n) if head_rows is None else np.unique(np.asarray(head_rows, np.int64))
        tape = Tape(prefix_k, prefix_v, rows_idx, *self._angles(rows, n))
        x = self.model.embed(np.asarray(tokens, np.int64)).astype(dtype)  # (n, n_embd)
        for i, p in enumerate(self.w.layers):
            tape.layer_inputs.append(x)
            x, saved = self.layer_forward(p, x, prefix_k[i], prefix_v[i], tape)
            if not checkpoint:
                tape.saved.append(saved)
        tape.final = x[rows_idx]
        normed, tape.inv_final = ops.rms_norm(tape.final, self.w.output_norm, self.w.eps)
        return _linear(normed, self.w.head), tape

    def backward(self, tape: Tape, dlogits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Gradients of the prefix's keys and values (shaped like them) from the gradient of
        the logits ``forward`` returned."""
        w = self.w
        dfinal = ops.rms_norm_backward(dlogits @ w.head, tape.final, w.output_norm, tape.inv_final)
        dx = np.zeros_like(tape.layer_inputs[0])
        dx[tape.head_rows] = dfinal  # head rows are distinct (np.unique in forward)
        dk, dv = np.zeros_like(tape.prefix_k), np.zeros_like(tape.prefix_v)
        for i in reversed(range(len(w.layers))):
            p = w.layers[i]
            if tape.saved:
                saved = tape.saved[i]
            else:  # checkpointed: recompute this layer's activations from its input
                x_in = tape.layer_inputs[i]
                _, saved = self.layer_forward(p, x_in, tape.prefix_k[i], tape.prefix_v[i], tape)
            dx, dk[i], dv[i] = self.layer_backward(p, saved, dx, tape)
        return dk, dv

    def _angles(self, rows: int, n: int) -> tuple[np.ndarray, np.ndarray, dict[float, int]]:
        """cos, sin (tables, n, n_rot/2) of the token positions rows .. rows+n, one table per
        RoPE base, and which table each base uses."""
        positions = np.arange(rows, rows + n)
        bases = sorted({p.rope_base for p in self.w.layers})
        tables = [rope_angles(positions, self.w.n_rot, b) for b in bases]
        index = {b: j for j, b in enumerate(bases)}
        return np.stack([c for c, _ in tables]), np.stack([s for _, s in tables]), index

    def _rope(self, p: LayerParams, x: np.ndarray, tape: Tape, inverse: bool = False) -> np.ndarray:
        j = tape.base_index[p.rope_base]
        return ops.rope(x, tape.cos[j], tape.sin[j], self.w.neox, inverse)

    def layer_forward(
        self, p: LayerParams, x: np.ndarray, prefix_k: np.ndarray, prefix_v: np.ndarray, tape: Tape
    ) -> tuple[np.ndarray, LayerSaved]:
        """One layer over x (n, n_embd) behind this layer's prefix rows (kv_heads, rows, d)."""
        w, eps = self.w, self.w.eps
        h, inv_attn = ops.rms_norm(x, p.attn_norm, eps)
        q = _heads(_linear(h, p.wq, p.bq), w.n_heads)  # (n, heads, d)
        k = _heads(_linear(h, p.wk, p.bk), w.n_kv_heads)  # (n, kvh, d)
        v = _heads(_linear(h, p.wv, p.bv), w.n_kv_heads)
        qn, inv_q = ops.rms_norm(q, p.q_norm, eps) if p.q_norm is not None else (q, None)
        kn, inv_k = ops.rms_norm(k, p.k_norm, eps) if p.k_norm is not None else (k, None)
        q_rot = self._rope(p, qn, tape).transpose(1, 0, 2)  # (heads, n, d)
        keys = np.concatenate([prefix_k.astype(x.dtype), self._rope(p, kn, tape).transpose(1, 0, 2)], axis=1)
        values = np.concatenate([prefix_v.astype(x.dtype), v.transpose(1, 0, 2)], axis=1)
        mask = ops.attention_mask(x.shape[0], prefix_k.shape[1], p.window)
        att, probs = ops.attention(q_rot, keys, values, mask, 1.0 / np.sqrt(w.head_dim))
        o = _linear(att.transpose(1, 0, 2).reshape(x.shape[0], -1), p.wo)
        o_out, inv_post_attn = o, None
        if p.post_attn_norm is not None:
            o_out, inv_post_attn = ops.rms_norm(o, p.post_attn_norm, eps)
        x1 = x + o_out
        h2, inv_ffn = ops.rms_norm(x1, p.ffn_norm, eps)
        gate, up = _linear(h2, p.w_gate), _linear(h2, p.w_up)
        f = _linear(ops.geglu(gate, up) if w.gelu else ops.swiglu(gate, up), p.w_down)
        y, inv_post_ffn = x1 + f, None
        if p.post_ffn_norm is not None:
            normed, inv_post_ffn = ops.rms_norm(f, p.post_ffn_norm, eps)
            y = x1 + normed
        saved = LayerSaved(
            x=x,
            h=h,
            inv_attn=inv_attn,
            q=q,
            k=k,
            inv_q=inv_q,
            inv_k=inv_k,
            q_rot=q_rot,
            keys=keys,
            values=values,
            probs=probs,
            o=o,
            inv_post_attn=inv_post_attn,
            x1=x1,
            h2=h2,
            inv_ffn=inv_ffn,
            gate=gate,
            up=up,
            f=f,
            inv_post_ffn=inv_post_ffn,
        )
        return y, saved

    def layer_backward(self, p: LayerParams, s: LayerSaved, dy: np.ndarray, tape: Tape):
        """dx (n, n_embd) and this layer's prefix dk, dv (kv_heads, rows, d) from dy."""
        w, rows = self.w, tape.prefix_k.shape[2]
        df = dy
        if p.post_ffn_norm is not None:
            df = ops.rms_norm_backward(dy, s.f, p.post_ffn_norm, s.inv_post_ffn)
        dm = df @ p.w_down
        dgate, dup = (ops.geglu_backward if w.gelu else ops.swiglu_backward)(dm, s.gate, s.up)
        dh2 = dgate @ p.w_gate + dup @ p.w_up
        dx1 = dy + ops.rms_norm_backward(dh2, s.x1, p.ffn_norm, s.inv_ffn)
        do = dx1
        if p.post_attn_norm is not None:
            do = ops.rms_norm_backward(dx1, s.o, p.post_attn_norm, s.inv_post_attn)
        datt = (do @ p.wo).reshape(do.shape[0], w.n_heads, -1).transpose(1, 0, 2)  # (heads, n, d)
        scale = 1.0 / np.sqrt(w.head_dim)
        dq_rot, dkeys, dvalues = ops.attention_backward(datt, s.q_rot, s.keys, s.values, s.probs, scale)
        dq = self._rope(p, dq_rot.transpose(1, 0, 2), tape, inverse=True)  # (n, heads, d)
        dk = self._rope(p, dkeys[:, rows:].transpose(1, 0, 2), tape, inverse=True)  # (n, kvh, d)
        dv = dvalues[:, rows:].transpose(1, 0, 2)
        if p.q_norm is not None:
            dq = ops.rms_norm_backward(dq, s.q, p.q_norm, s.inv_q)
        if p.k_norm is not None:
            dk = ops.rms_norm_backward(dk, s.k, p.k_norm, s.inv_k)
        n = dy.shape[0]
        dh = dq.reshape(n, -1) @ p.wq + dk.reshape(n, -1) @ p.wk + dv.reshape(n, -1) @ p.wv
        dx = dx1 + ops.rms_norm_backward(dh, s.x, p.attn_norm, s.inv_attn)
        return dx, dkeys[:, :rows], dvalues[:, :rows]
