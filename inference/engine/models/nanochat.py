"""nanochat's GPT (karpathy/nanochat, as the reference port defines it in fucina
``examples/nanochat/model.zig``): float32 numpy, one conversation, a KV cache of its own.

What sets it apart from the GGUF families:

- the token embedding is RMS-normed (no norm has a weight; eps is float32's machine epsilon,
  what ``F.rms_norm`` uses by default), then *smeared*: each position adds a gated share of
  the previous position's normed embedding;
- every layer first mixes the residual with the post-smear embedding ``x0``
  (``resid_lambdas[i] * x + x0_lambdas[i] * x0``);
- alternate layers (the last included) add a gated *value embedding* of the token to v;
- q and k are rotated (halves, base 100000, sin with the opposite sign of NeoX), RMS-normed,
  then both scaled by 1.2; attention uses SDPA's 1/sqrt(head_dim) on top and sees at most the
  last ``sequence_len + 1`` keys;
- the MLP is relu(x W_fc)^2 W_proj; no linear has a bias;
- *backout*: the residual after layer ``n_layer // 2`` is subtracted, times ``backout_lambda``,
  before the final norm; the head is untied and its logits are soft-capped at 15.

Products use numpy's matmul (BLAS): this family reuses no KV rows across requests and batches
nothing, so the engine's path invariance (docs/ARCHITECTURE.md) is not needed here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RMS_EPS = np.float32(np.finfo(np.float32).eps)  # F.rms_norm's default eps (2^-23)
ROPE_THETA = 100000.0
QK_SCALE = np.float32(1.2)
SOFTCAP = np.float32(15.0)
SMEAR_CHANNELS = 24  # smear_gate reads the first 24 channels of the normed embedding
VE_GATE_CHANNELS = 12  # ve_gate reads the first 12 channels of the attention input
SEQUENCE_LEN = 512  # the trained context; the attention window is sequence_len + 1 keys


@dataclass(frozen=True)
class NanochatConfig:
    """Geometry of a checkpoint (read from its tensor shapes, see nanochat_checkpoint.py)."""

    vocab_size: int  # real tokens (the tokenizer's n_vocab); the matrices pad it to 64
    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    head_dim: int
    sequence_len: int = SEQUENCE_LEN

    @property
    def window(self) -> int:
        """Keys a query sees: itself and the ``sequence_len`` before it (gpt.py maps every
        'L' layer to the finite window (sequence_len, 0))."""
        return self.sequence_len + 1

    @property
    def backout_layer(self) -> int:
        return self.n_layer // 2

    def has_value_embedding(self, layer: int) -> bool:
        """gpt.py has_ve: alternate layers, the last one included."""
        return layer % 2 == (self.n_layer - 1) % 2


@dataclass(frozen=True)
class NanochatLayer:
    """One block's matrices, stored (out, in) as torch does."""

    c_q: np.ndarray  # (n_head * head_dim, n_embd)
    c_k: np.ndarray  # (n_kv_head * head_dim, n_embd)
    c_v: np.ndarray  # (n_kv_head * head_dim, n_embd)
    c_proj: np.ndarray  # (n_embd, n_head * head_dim)
    c_fc: np.ndarray  # (4 * n_embd, n_embd)
    mlp_proj: np.ndarray  # (n_embd, 4 * n_embd)
    ve_gate: np.ndarray | None  # (n_kv_head, 12) on value-embedding layers
    value_embed: np.ndarray | None  # (padded_vocab, n_kv_head * head_dim) on the same layers


@dataclass(frozen=True)
class NanochatWeights:
    """Every parameter of the checkpoint as float32."""

    wte: np.ndarray  # (padded_vocab, n_embd)
    lm_head: np.ndarray  # (padded_vocab, n_embd)
    resid_lambdas: np.ndarray  # (n_layer,)
    x0_lambdas: np.ndarray  # (n_layer,)
    smear_gate: np.ndarray  # (1, 24)
    smear_lambda: float
    backout_lambda: float
    layers: tuple[NanochatLayer, ...]


class NanochatCache:
    """One conversation's K/V rows (after RoPE and norm) and the last normed embedding, which
    the next token's smear mixes in."""

    def __init__(self, config: NanochatConfig, capacity: int):
        shape = (config.n_layer, capacity, config.n_kv_head, config.head_dim)
        self.k = np.zeros(shape, dtype=np.float32)  # (n_layer, capacity, n_kv_head, head_dim)
        self.v = np.zeros(shape, dtype=np.float32)  # (n_layer, capacity, n_kv_head, head_dim)
        self.length = 0
        self.prev_embedding: np.ndarray | None = None  # (n_embd,)

    @property
    def capacity(self) -> int:
        return self.k.shape[1]


class ContextFull(ValueError):
    """More tokens than the cache was made for."""


def rms_norm(x: np.ndarray) -> np.ndarray:
    """Unit RMS over the last axis, no weight."""
    mean_sq = np.mean(np.square(x), axis=-1, keepdims=True)
    return (x / np.sqrt(mean_sq + RMS_EPS)).astype(np.float32)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)


def rope_tables(positions: np.ndarray, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of each position's angles: frequency j is theta^(-2j / head_dim)."""
    inv_freq = 1.0 / ROPE_THETA ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # (hd/2,)
    angles = np.outer(positions.astype(np.float64), inv_freq)  # (seq, hd/2)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """gpt.py apply_rotary_emb on (seq, heads, head_dim): halves x1, x2 become
    x1 cos + x2 sin and x2 cos - x1 sin."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]  # (seq, heads, hd/2) each
    c, s = cos[:, None, :], sin[:, None, :]  # (seq, 1, hd/2)
    return np.concatenate([x1 * c + x2 * s, x2 * c - x1 * s], axis=-1)  # (seq, heads, hd)


class NanochatModel:
    """The forward over a :class:`NanochatCache`: ``forward(cache, ids)`` appends the tokens
    and returns their logits."""

    def __init__(self, config: NanochatConfig, weights: NanochatWeights):
        self.config = config
        self.weights = weights

    def new_cache(self, capacity: int) -> NanochatCache:
        return NanochatCache(self.config, capacity)

    def forward(self, cache: NanochatCache, ids: list[int]) -> np.ndarray:
        """Logits (len(ids), vocab_size) of ``ids`` placed after the cache's rows."""
        cfg, w = self.config, self.weights
        if cache.length + len(ids) > cache.capacity:
            raise ContextFull(f"{cache.length} + {len(ids)} tokens exceed the cache's {cache.capacity} rows")
        tokens = np.asarray(ids, dtype=np.int64)  # (seq,)
        x0 = self._embed(cache, tokens)  # (seq, n_embd)
        positions = np.arange(cache.length, cache.length + len(ids))  # (seq,)
        cos, sin = rope_tables(positions, cfg.head_dim)  # (seq, hd/2) each
        x, backout = x0, None
        for i, layer in enumerate(w.layers):
            x = w.resid_lambdas[i] * x + w.x0_lambdas[i] * x0  # (seq, n_embd)
            x = x + self._attention(cache, i, layer, rms_norm(x), tokens, cos, sin)
            x = x + self._mlp(layer, rms_norm(x))
            if i == cfg.backout_layer:
                backout = x
        cache.length += len(ids)
        if backout is not None:
            x = x - np.float32(w.backout_lambda) * backout
        logits = rms_norm(x) @ w.lm_head.T  # (seq, padded_vocab)
        return (SOFTCAP * np.tanh(logits[:, : cfg.vocab_size] / SOFTCAP)).astype(np.float32)

    def _embed(self, cache: NanochatCache, tokens: np.ndarray) -> np.ndarray:
        """Normed token embeddings, each mixed with the previous position's (smear); the first
        token of a chunk with the cache's last embedding, so a prompt prefilled in chunks gets
        the logits of the whole-sequence forward. (The reference mixes it only into a token
        decoded alone; it prefills every prompt in one chunk on a fresh cache, where the two
        agree.)"""
        w = self.weights
        emb = rms_norm(w.wte[tokens])  # (seq, n_embd)
        prev = emb[:-1]  # (seq - 1, n_embd)
        if cache.prev_embedding is not None:
            prev = np.concatenate([cache.prev_embedding[None, :], prev])  # (seq, n_embd)
        rows = emb[len(emb) - len(prev) :]  # the positions that mix: (len(prev), n_embd)
        gate = np.float32(w.smear_lambda) * sigmoid(rows[:, :SMEAR_CHANNELS] @ w.smear_gate[0])  # (n,)
        mixed = emb.copy()  # (seq, n_embd)
        mixed[len(emb) - len(prev) :] = rows + gate[:, None] * prev
        cache.prev_embedding = emb[-1].copy()
        return mixed

    def _attention(self, cache, i, layer, h, tokens, cos, sin) -> np.ndarray:
        """Attention of the chunk over the cache's rows and its own; (seq, n_embd)."""
        cfg = self.config
        seq = len(tokens)
        q = (h @ layer.c_q.T).reshape(seq, cfg.n_head, cfg.head_dim)  # (seq, n_head, hd)
        k = (h @ layer.c_k.T).reshape(seq, cfg.n_kv_head, cfg.head_dim)  # (seq, n_kv, hd)
        v = (h @ layer.c_v.T).reshape(seq, cfg.n_kv_head, cfg.head_dim)  # (seq, n_kv, hd)
        if layer.value_embed is not None:
            ve = layer.value_embed[tokens].reshape(seq, cfg.n_kv_head, cfg.head_dim)  # (seq, n_kv, hd)
            gate = 3.0 * sigmoid(h[:, :VE_GATE_CHANNELS] @ layer.ve_gate.T)  # (seq, n_kv)
            v = v + gate[:, :, None] * ve
        q = rms_norm(apply_rope(q, cos, sin)) * QK_SCALE
        k = rms_norm(apply_rope(k, cos, sin)) * QK_SCALE
        start, end = cache.length, cache.length + seq
        cache.k[i, start:end] = k
        cache.v[i, start:end] = v
        y = self._attend(q, cache.k[i, :end], cache.v[i, :end], start)  # (seq, n_head, hd)
        return y.reshape(seq, -1) @ layer.c_proj.T  # (seq, n_embd)

    def _attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int) -> np.ndarray:
        """Causal, windowed softmax attention; query r sits at position start + r."""
        cfg = self.config
        group = cfg.n_head // cfg.n_kv_head
        k_heads = np.repeat(k, group, axis=1)  # (keys, n_head, hd)
        v_heads = np.repeat(v, group, axis=1)  # (keys, n_head, hd)
        scale = np.float32(1.0 / np.sqrt(cfg.head_dim))  # SDPA's default, on top of the 1.2s
        scores = np.einsum("qhd,khd->hqk", q, k_heads) * scale  # (n_head, seq, keys)
        query_pos = np.arange(start, start + q.shape[0])[:, None]  # (seq, 1)
        key_pos = np.arange(k.shape[0])[None, :]  # (1, keys)
        visible = (key_pos <= query_pos) & (query_pos - key_pos < cfg.window)  # (seq, keys)
        scores = np.where(visible[None], scores, -np.inf)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)  # (n_head, seq, keys)
        return np.einsum("hqk,khd->qhd", probs, v_heads).astype(np.float32)  # (seq, n_head, hd)

    @staticmethod
    def _mlp(layer: NanochatLayer, m: np.ndarray) -> np.ndarray:
        hidden = np.maximum(m @ layer.c_fc.T, 0.0)  # (seq, 4 * n_embd)
        return np.square(hidden) @ layer.mlp_proj.T  # (seq, n_embd)
