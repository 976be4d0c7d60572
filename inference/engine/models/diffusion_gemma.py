"""DiffusionGemma (``diffusion-gemma``): block text diffusion over Gemma 4's layers.

The transformer is Gemma 4 (gemma4.py) with one weight set run two ways:

- the **encoder pass** (``block``, so ``forward``/``encode``): causal, over the prompt and then
  each committed canvas; it writes and commits cache rows, and each layer ends with
  ``enc_layer_output_scale`` instead of ``layer_output_scale``;
- the **canvas pass** (``canvas_forward``): the whole canvas of ``diffusion.canvas_length``
  tokens at positions [P, P + C) after the P committed rows, attending bidirectionally: every
  canvas query sees every canvas key and the committed rows before them (on sliding-window
  layers only the last window - 1 of those). Its k and v rows go into the cache's rows past P
  without being committed (the next step overwrites them); each layer ends with
  ``layer_output_scale``; logits come back for every row.

The canvas embedding is ``rms_norm(embed * sqrt(n_embd) + sc)`` (no weight), where ``sc`` is
the self-conditioning signal: the previous step's softmax(logits / t) times the embedding
matrix, through the ``self_cond_*`` GeGLU MLP. The softmax is kept sparse (the candidates
the sampler collected, diffusion_sampler.py), as the reference implementation keeps it on
CPU; without ``self_cond_*`` tensors the signal is zero. The entropy-bound sampler that drives
the passes is ``inference/engine/diffusion_sampler.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..fused.kernels import attend_rows
from ..fused.rowops import gelu_tanh_f16
from ..gguf_file import GGUFError, GGUFFile
from ..kv_cache import KVCache
from .base import linear
from .gemma4 import Gemma4Model, softcap_rows
from .layers import rms_norm

SELF_COND = ("self_cond_gate", "self_cond_up", "self_cond_down")


@dataclass(frozen=True)
class EntropyBound:
    """The entropy-bound sampler's settings: the model's generation_config defaults,
    overridden by the GGUF's ``diffusion.eb_*`` keys."""

    max_steps: int = 48
    t_min: float = 0.4  # the temperature schedule runs from t_max (first step) towards t_min
    t_max: float = 0.8
    entropy_bound: float = 0.1  # accepted positions' summed entropy (nats) stays within this
    stability_threshold: int = 1  # steps with an unchanged argmax canvas before an early stop
    confidence_threshold: float = 0.005  # ... and a mean entropy below this


@dataclass(frozen=True)
class DiffusionConfig:
    """What the denoiser reads from the file besides the Gemma 4 config."""

    canvas_length: int
    sampler: EntropyBound


@dataclass(frozen=True)
class SelfCondition:
    """The previous step's sparse softmax(logits / t): row c's candidates are
    ``ids[offsets[c]:offsets[c + 1]]`` with probabilities ``probs`` (renormalized over them)."""

    ids: np.ndarray  # (m,) int64
    probs: np.ndarray  # (m,) float32
    offsets: np.ndarray  # (canvas + 1,) int64


def diffusion_config(f: GGUFFile) -> DiffusionConfig:
    """The canvas length (required) and the sampler settings of a diffusion-gemma file."""
    meta = f.metadata
    canvas = int(meta.get("diffusion.canvas_length", 0))
    if canvas <= 0:
        raise GGUFError(f"{f.path}: diffusion-gemma needs a positive diffusion.canvas_length")
    base = EntropyBound()
    steps = int(meta.get("diffusion.eb_max_steps", 0))
    sampler = EntropyBound(
        max_steps=steps if steps > 0 else base.max_steps,
        t_min=float(meta.get("diffusion.eb_t_min", base.t_min)),
        t_max=float(meta.get("diffusion.eb_t_max", base.t_max)),
        entropy_bound=float(meta.get("diffusion.eb_entropy_bound", base.entropy_bound)),
        stability_threshold=max(
            0, int(meta.get("diffusion.eb_stability_threshold", base.stability_threshold))
        ),
        confidence_threshold=float(meta.get("diffusion.eb_confidence_threshold", base.confidence_threshold)),
    )
    return DiffusionConfig(canvas, sampler)


def attend_canvas(q: np.ndarray, keys: np.ndarray, values: np.ndarray, start: int, reach: int) -> np.ndarray:
    """Bidirectional attention of the canvas queries q (n, heads, hd) at positions
    start..start+n over cache rows [lo, start + n) (kvh, ctx, hd) f16, lo = start + 1 - reach
    (0 when reach is 0): every query attends the same keys, so each is run as the last
    canvas row would be by the causal kernel, heads and rows folded into one axis."""
    n, n_heads, hd = q.shape
    folded = np.ascontiguousarray(q.transpose(1, 0, 2).reshape(1, n_heads * n, hd))  # (1, heads*n, hd)
    out = np.empty_like(folded)  # (1, heads*n, hd)
    window = reach + n - 1 if reach > 0 else 0  # keys counted back from the last canvas row
    attend_rows(
        folded, keys.view(np.uint16), values.view(np.uint16), start + n - 1, window, np.float32(1.0), out
    )
    return out.reshape(n_heads, n, hd).transpose(1, 0, 2)  # (n, heads, hd)


class DiffusionGemmaModel(Gemma4Model):
    """Gemma 4's layers with the encoder and canvas passes (see the module docstring)."""

    def __init__(self, f: GGUFFile):
        self.diffusion = diffusion_config(f)
        super().__init__(f)
        self.self_cond = self.load_self_cond()

    def load_layer(self, i: int) -> dict:
        """Gemma 4's layer with both output scales required: the encoder pass's takes the
        ``out_scale`` slot (Gemma4Model.block applies it), the canvas pass's ``canvas_scale``."""
        layer = super().load_layer(i)
        enc = self.optional_vector(f"blk.{i}.enc_layer_output_scale.weight")
        if layer["out_scale"] is None or enc is None:
            raise GGUFError(
                f"{self.file.path}: diffusion-gemma layer {i} needs layer_output_scale "
                "and enc_layer_output_scale"
            )
        layer["canvas_scale"] = layer["out_scale"]
        layer["out_scale"] = np.float32(enc.reshape(-1)[0])
        return layer

    def load_self_cond(self) -> dict | None:
        """The self-conditioning MLP, or None when the file has none (the signal is zero)."""
        if not self.file.has_tensor("self_cond_pre_norm.weight"):
            return None
        mlp = {name: self.matrix(f"{name}.weight") for name in SELF_COND}
        mlp["pre_norm"] = self.vector("self_cond_pre_norm.weight")
        return mlp

    # -- encoder pass ----------------------------------------------------------------------
    def encode(self, tokens: list[int], cache: KVCache) -> None:
        """Append ``tokens`` (the prompt, or a committed canvas) to ``cache`` through the causal
        encoder pass; no logits (only the rows matter)."""
        if not tokens:
            raise ValueError("encode needs at least one token")
        cache.check_room(len(tokens))
        self._residual_layers(list(tokens), cache)

    # -- canvas pass -----------------------------------------------------------------------
    def canvas_forward(
        self, canvas: np.ndarray, cache: KVCache, sc: SelfCondition | None = None
    ) -> np.ndarray:
        """Logits (n, vocab) of every canvas row, the canvas at the positions after what
        ``cache`` holds; the cache's committed rows are unchanged."""
        n, start = len(canvas), cache.n_positions
        cache.check_room(n)
        x = self.canvas_embed(np.asarray(canvas, np.int64), sc)  # (n, n_embd)
        for layer in range(self.config.n_layers):
            x = self.canvas_layer(layer, x, cache, start)
        logits = linear(self.output, rms_norm(x, self.output_norm, self.config.norm_eps))  # (n, vocab)
        if self.softcap > 0:
            softcap_rows(logits, self.softcap)
        return logits

    def canvas_embed(self, canvas: np.ndarray, sc: SelfCondition | None) -> np.ndarray:
        """rms_norm(embed * sqrt(n_embd) + self-conditioning signal), no weight (n, n_embd)."""
        x = self.embed(canvas)  # (n, n_embd)
        if sc is not None:
            if self.self_cond is None:
                raise ValueError("this file has no self-conditioning weights")
            x = x + self.self_cond_signal(sc, len(canvas))
        return rms_norm(x, np.float32(1.0), self.config.norm_eps)

    def self_cond_signal(self, sc: SelfCondition, n: int) -> np.ndarray:
        """The self_cond GeGLU MLP on the soft embedding sum_i p_i * embed[id_i] (n, n_embd)."""
        if len(sc.offsets) != n + 1:
            raise ValueError(f"self-conditioning rows {len(sc.offsets) - 1} != canvas {n}")
        rows = self.token_embd.take_rows(sc.ids) * sc.probs[:, None]  # (m, n_embd)
        soft = np.zeros((n, rows.shape[1]), np.float32)  # (n, n_embd)
        np.add.at(soft, np.repeat(np.arange(n), np.diff(sc.offsets)), rows)
        soft *= self.embed_scale
        w, eps = self.self_cond, self.config.norm_eps
        h = rms_norm(soft, w["pre_norm"], eps)  # (n, n_embd)
        gated = gelu_tanh_f16(linear(w["self_cond_gate"], h)) * linear(w["self_cond_up"], h)  # (n, n_ff)
        return linear(w["self_cond_down"], gated)  # (n, n_embd)

    def canvas_layer(self, layer: int, x: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        """One layer of the canvas pass over x (n, n_embd): Gemma 4's block with bidirectional
        attention and the canvas output scale."""
        w, s, eps, n = self.layers[layer], self.shapes[layer], self.config.norm_eps, x.shape[0]
        q, keys, values = self.project_qkv(layer, w, rms_norm(x, w["attn_norm"], eps), cache, start)
        reach = self.config.sliding_window if s.local else 0
        out = attend_canvas(q, keys, values, start, reach)  # (n, heads, hd)
        h = linear(w["attn_output"], np.ascontiguousarray(out).reshape(n, -1))  # (n, n_embd)
        x = rms_norm(h, w["post_attention_norm"], eps) + x
        x = rms_norm(self.feed_forward(w, x), w["post_ffw_norm"], eps) + x
        return x * w["canvas_scale"]
