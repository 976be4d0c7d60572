"""An independent reference of Inkling's forward, for the tests only.

Written apart from ``inference/engine/models/inkling*.py`` and shaped differently on purpose:
weights read with the ``gguf`` package's own reader and dequantizer (not our loader or
kernels), hyperparameters from the synthetic file's spec (not our metadata parser), float64
throughout, and one token at a time with plain loops over heads, keys, taps and experts. The
definitions are the reference implementation's (fucina ``src/llm/inkling/model.zig``). One
deliberate match with the engine: keys and values are rounded to float16 where they are
stored, as llama.cpp's default cache (and ours) keeps them.
"""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np

from tests.fixtures.synthetic_inkling import N_PAD, InklingSpec


def load_weights(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of the file dequantized to float64, in numpy (row-major) shape."""
    reader = gguf.GGUFReader(path)
    out = {}
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        out[t.name] = np.asarray(values, np.float64).reshape(tuple(int(d) for d in reversed(t.shape)))
    return out


def rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / math.sqrt(float(np.mean(x * x)) + eps) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


class ReferenceInkling:
    """Token-at-a-time forward with its own caches (lists of past rows)."""

    EPS = 1e-6

    def __init__(self, path: Path, spec: InklingSpec):
        self.s = spec
        self.w = load_weights(path)
        self.keys = [[] for _ in spec.local]  # per layer: one (kvh, hd) row per position
        self.values = [[] for _ in spec.local]
        self.conv_inputs = [{site: [] for site in ("k", "v", "attn", "mlp")} for _ in spec.local]

    def conv(self, layer: int, site: str, x: np.ndarray) -> np.ndarray:
        """x + sum_j kernel[:, j] * input[t - (K-1) + j] over this site's past inputs."""
        history = self.conv_inputs[layer][site]
        history.append(x)
        kernel = self.w[f"blk.{layer}.shortconv_{site}.weight"]  # (width, K)
        taps = kernel.shape[1]
        y = x.copy()
        for j in range(taps):
            back = taps - 1 - j  # how many steps before the newest input
            if len(history) - 1 - back >= 0:
                y = y + kernel[:, j] * history[len(history) - 1 - back]
        return y

    def attention(self, layer: int, h: np.ndarray, pos: int) -> np.ndarray:
        s, w, p = self.s, self.w, f"blk.{layer}."
        kvh, hd = s.kv_heads[layer], s.head_dim
        q = w[p + "attn_q.weight"] @ h
        k = self.conv(layer, "k", w[p + "attn_k.weight"] @ h)
        v = self.conv(layer, "v", w[p + "attn_v.weight"] @ h)
        r = w[p + "attn_r.weight"] @ h
        tau = 1.0
        if not s.local[layer] and s.log_n_floor > 0:
            tau = 1.0 + s.log_alpha * math.log(max((pos + 1) / s.log_n_floor, 1.0))
        q_heads = [
            rms(q[i * hd : (i + 1) * hd], w[p + "attn_q_norm.weight"], self.EPS) * tau
            for i in range(s.n_heads)
        ]
        k_heads = np.stack(
            [rms(k[i * hd : (i + 1) * hd], w[p + "attn_k_norm.weight"], self.EPS) for i in range(kvh)]
        )
        self.keys[layer].append(k_heads.astype(np.float16).astype(np.float64))
        self.values[layer].append(v.reshape(kvh, hd).astype(np.float16).astype(np.float64))
        rel_proj = w[p + "attn_rel_proj.weight"]  # (d_rel, extent)
        out = []
        for head in range(s.n_heads):
            kv = head // (s.n_heads // kvh)
            rel = (r[head * s.d_rel : (head + 1) * s.d_rel] @ rel_proj) * tau  # (extent,)
            visible = [t for t in range(pos + 1) if not s.local[layer] or pos - t < s.window]
            scores = []
            for t in visible:
                score = float(q_heads[head] @ self.keys[layer][t][kv]) / hd
                if pos - t < rel.shape[0]:
                    score += rel[pos - t]
                scores.append(score)
            scores = np.exp(np.array(scores) - max(scores))
            scores /= scores.sum()
            out.append(sum(a * self.values[layer][t][kv] for a, t in zip(scores, visible)))
        return self.conv(layer, "attn", w[p + "attn_output.weight"] @ np.concatenate(out))

    def moe(self, layer: int, h: np.ndarray) -> np.ndarray:
        s, w, p = self.s, self.w, f"blk.{layer}."
        logits = w[p + "ffn_gate_inp.weight"] @ h
        scores = 1.0 / (1.0 + np.exp(-logits[: s.n_expert])) + w[p + "exp_probs_b.bias"]
        chosen = []
        for _ in range(s.n_expert_used):
            best = int(np.argmax(scores))  # the first of equal maxima: the lower id
            chosen.append(best)
            scores[best] = -np.inf
        picked = [logits[e] for e in chosen] + [logits[s.n_expert + j] for j in range(s.n_shared)]
        logsig = np.array([-math.log1p(math.exp(-z)) for z in picked])
        mix = np.exp(logsig - logsig.max())
        mix = mix / mix.sum() * s.route_scale * float(w[p + "ffn_gscale.weight"][0])
        out = np.zeros_like(h)
        for slot, e in enumerate(chosen):
            act = silu(w[p + "ffn_gate_exps.weight"][e] @ h) * (w[p + "ffn_up_exps.weight"][e] @ h)
            out += mix[slot] * (w[p + "ffn_down_exps.weight"][e] @ act)
        for j in range(s.n_shared):
            act = silu(w[p + "ffn_gate_shexp.weight"][j] @ h) * (w[p + "ffn_up_shexp.weight"][j] @ h)
            out += w[p + "ffn_down_shexp.weight"][j] @ (act * mix[s.n_expert_used + j])
        return out

    def ffn(self, layer: int, h: np.ndarray) -> np.ndarray:
        w, p = self.w, f"blk.{layer}."
        if layer >= self.s.dense_layers:
            return self.moe(layer, h)
        act = silu(w[p + "ffn_gate.weight"] @ h) * (w[p + "ffn_up.weight"] @ h)
        return (w[p + "ffn_down.weight"] @ act) * float(w[p + "ffn_gscale.weight"][0])

    def step(self, token: int, pos: int) -> np.ndarray:
        """The logits (vocab,) after ``token`` at position ``pos`` (positions in order from 0)."""
        w = self.w
        x = rms(w["token_embd.weight"][token], w["token_embd_norm.weight"], self.EPS)
        for layer in range(len(self.s.local)):
            p = f"blk.{layer}."
            x = x + self.attention(layer, rms(x, w[p + "attn_norm.weight"], self.EPS), pos)
            x = x + self.conv(layer, "mlp", self.ffn(layer, rms(x, w[p + "ffn_norm.weight"], self.EPS)))
        h = rms(x, w["output_norm.weight"], self.EPS) / self.s.logit_scale_denom
        logits = w["output.weight"] @ h
        logits[logits.shape[0] - N_PAD :] = -np.inf
        return logits

    def run(self, tokens: list[int]) -> np.ndarray:
        """Every position's logits (n, vocab) of a fresh conversation."""
        return np.stack([self.step(t, i) for i, t in enumerate(tokens)])
