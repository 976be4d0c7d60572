"""Inkling's feed-forward: a SwiGLU MLP on the leading dense layers, a sigmoid-routed mixture
of experts on the rest, both scaled by the layer's ``ffn_gscale``.

The mixture, as the reference (llama.cpp PR #25731, fucina ``src/llm/inkling/model.zig``)
computes it: the router has one row per routed expert and one per shared expert. The routed
experts are chosen on ``sigmoid(logit) + exp_probs_b`` (the bias steers the choice only),
the k largest, equal scores keeping the lower id. The mixture weights are a softmax over the
chosen experts' ``logsigmoid(logit)`` together with every shared expert's (the shared
experts act as sinks of the same softmax), times ``expert_weights_scale`` and the gscale. A
routed expert's weight scales its output after the down projection; a shared expert's scales
its SwiGLU activation before it (as the reference graph does).
"""

from __future__ import annotations

import numpy as np

from ..gguf_file import GGUFError, GGUFFile
from ..quants import QuantMatrix, load_matrix
from .base import linear
from .experts import routed_experts
from .gemma4_moe import expert_matrices


def silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


def logsigmoid(x: np.ndarray) -> np.ndarray:
    """log(sigmoid(x)) = -log1p(exp(-x)), in float32."""
    return -np.log1p(np.exp(-x))


def swiglu(gate: QuantMatrix, up: QuantMatrix, down: QuantMatrix, h: np.ndarray, gamma=None) -> np.ndarray:
    """down(silu(gate h) * up h [* gamma]) for rows h (n, n_embd) -> (n, n_embd); ``gamma``
    (n, 1) scales the activation before the down projection."""
    act = silu(linear(gate, h)) * linear(up, h)  # (n, n_ff)
    if gamma is not None:
        act = act * gamma
    return linear(down, act)


def top_k_lowest_id(scores: np.ndarray, k: int) -> np.ndarray:
    """The k largest entries of each row of scores (n, n_expert) in descending order, an equal
    score keeping the lower id first; (n, k)."""
    return np.argsort(-scores, axis=-1, kind="stable")[:, :k]


class InklingMoE:
    """One layer's router, routed experts and shared experts."""

    def __init__(self, f: GGUFFile, layer: int, n_used: int, n_shared: int, route_scale: float):
        p = f"blk.{layer}."
        t = f.tensor(p + "ffn_gate_inp.weight")
        self.router = load_matrix(t.type, t.data, t.shape, t.name)  # (n_expert + n_shared, n_embd)
        self.bias = np.asarray(f.tensor(p + "exp_probs_b.bias").data, np.float32).reshape(-1)  # (n_expert,)
        self.gate = routed_experts(f, p + "ffn_gate_exps.weight")
        self.up = routed_experts(f, p + "ffn_up_exps.weight")
        self.down = routed_experts(f, p + "ffn_down_exps.weight")
        self.shared_gate = expert_matrices(f, p + "ffn_gate_shexp.weight")
        self.shared_up = expert_matrices(f, p + "ffn_up_shexp.weight")
        self.shared_down = expert_matrices(f, p + "ffn_down_shexp.weight")
        n_expert = len(self.gate)
        if len(self.shared_gate) != n_shared or self.router.rows != n_expert + n_shared:
            raise GGUFError(
                f"{f.path}: layer {layer}: the router has {self.router.rows} rows for {n_expert} "
                f"experts and {len(self.shared_gate)} shared ones (expert_shared_count {n_shared})"
            )
        if not 0 < n_used <= n_expert or self.bias.shape[0] != n_expert:
            raise GGUFError(
                f"{f.path}: layer {layer}: expert_used_count {n_used} or exp_probs_b does not fit"
            )
        self.n_expert, self.n_used = n_expert, n_used
        self.route_scale = np.float32(route_scale)

    def route(self, h: np.ndarray, gscale: np.float32) -> tuple[np.ndarray, np.ndarray]:
        """Chosen experts (n, k) and mixture weights (n, k + n_shared): the chosen experts' first,
        then the shared experts', all already times route_scale and gscale."""
        logits = linear(self.router, h)  # (n, n_expert + n_shared)
        routed = logits[:, : self.n_expert]  # (n, n_expert)
        chosen = top_k_lowest_id(
            np.float32(1.0) / (np.float32(1.0) + np.exp(-routed)) + self.bias, self.n_used
        )
        mix = np.concatenate(
            [np.take_along_axis(routed, chosen, axis=-1), logits[:, self.n_expert :]], axis=-1
        )  # (n, k + n_shared)
        mix = logsigmoid(mix)
        mix = np.exp(mix - mix.max(axis=-1, keepdims=True))
        mix = mix / mix.sum(axis=-1, keepdims=True)
        return chosen, mix * (self.route_scale * gscale)

    def __call__(self, h: np.ndarray, gscale: np.float32) -> np.ndarray:
        """The mixture for rows h (n, n_embd): routed outputs added in expert order, then the
        shared experts in order (per row the same order whatever rows share the call)."""
        chosen, mix = self.route(h, gscale)
        out = np.zeros_like(h)  # (n, n_embd)
        for e in np.unique(chosen):
            rows, slot = np.nonzero(chosen == e)
            y = swiglu(self.gate[e], self.up[e], self.down[e], h[rows])  # (m, n_embd)
            out[rows] += y * mix[rows, slot][:, None]
        for s in range(len(self.shared_gate)):
            gamma = mix[:, self.n_used + s][:, None]  # (n, 1)
            out += swiglu(self.shared_gate[s], self.shared_up[s], self.shared_down[s], h, gamma)
        return out
