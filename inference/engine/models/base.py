"""What every decoder family shares: weight loading, the layer loop, the output head.

A family subclasses :class:`DecoderModel`, reads its config and weights, and writes
``block`` — one transformer layer — in its own file.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..fused.fused import FusedForward, LayerWeights, RowPlan
from ..fused.kernels import attend_rows
from ..gguf_file import GGUFFile
from ..kv_cache import KVCache
from ..quants import GroupedMatrix, QuantMatrix, load_matrix
from ..quants.lookup import MappedRows
from .config import ModelConfig
from .layers import ROPE_NEOX, apply_rope, rms_norm, rope_angles


def linear(weight: QuantMatrix, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """x (n, cols) @ weight.T (+ bias) -> (n, rows); each row's result independent of n."""
    return weight.matmul(np.ascontiguousarray(x), bias)


@dataclass(frozen=True)
class Run:
    """Tokens appended to one cache by a forward, and whether every position's logits come
    back (a verify run) or only the last one's."""

    cache: KVCache
    tokens: Sequence[int]
    all_logits: bool = False

    @property
    def n_logits(self) -> int:
        return len(self.tokens) if self.all_logits else 1


def stack_linears(layer: dict, names: tuple[str, ...], key: str) -> None:
    """Replace the matrices ``names`` of a layer by one stacked matrix under ``key`` when they
    share a format (with their biases stacked too, absent ones as zeros): one kernel call, one
    rounding of the shared input. Otherwise the layer stays as it is."""
    matrices = [layer[name] for name in names]
    if not GroupedMatrix.can_stack(matrices):
        return
    biases = [layer.get(name + "_bias") for name in names]
    if any(b is not None for b in biases):
        parts = [
            np.zeros(m.rows, np.float32) if b is None else b for m, b in zip(matrices, biases, strict=True)
        ]
        layer[key + "_bias"] = np.concatenate(parts).astype(np.float32)  # (sum rows,)
    layer[key] = GroupedMatrix.stack(matrices)
    layer[key + "_splits"] = np.cumsum([m.rows for m in matrices])[:-1]
    for name in names:
        del layer[name]


def stacked_linears(layer: dict, names: tuple[str, ...], key: str, x: np.ndarray) -> list[np.ndarray]:
    """The outputs of linears ``names`` on x (n, cols), through their stacked matrix if any."""
    if key in layer:
        out = linear(layer[key], x, layer.get(key + "_bias"))  # (n, sum rows)
        return np.split(out, layer[key + "_splits"], axis=-1)
    return [linear(layer[name], x, layer.get(name + "_bias")) for name in names]


def layer_slots(w: dict) -> tuple[tuple, tuple]:
    """A layer's linears and biases in the fused step's slot order (q, k, v, out, gate, up,
    down), stacked matrices in the first slot of their group."""
    if "attn_qkv" in w:
        qkv, qkv_bias = [w["attn_qkv"], None, None], [w.get("attn_qkv_bias"), None, None]
    else:
        qkv = [w["attn_q"], w["attn_k"], w["attn_v"]]
        qkv_bias = [w.get("attn_q_bias"), w.get("attn_k_bias"), w.get("attn_v_bias")]
    gate_up = [w["ffn_gate_up"], None] if "ffn_gate_up" in w else [w["ffn_gate"], w["ffn_up"]]
    linears = (*qkv, w["attn_output"], *gate_up, w["ffn_down"])
    return linears, (*qkv_bias, None, None, None, None)


class DecoderModel(ABC):
    """A decoder-only transformer over a GGUF file; subclasses define ``block`` and, for the
    fused forward, ``step_layers``."""

    rope_style: str = "norm"
    step_flags: int = 0  # the family's switches of the fused forward (step_kernels QK_NORM, ...)
    fused: FusedForward | None = None

    def __init__(self, f: GGUFFile, config: ModelConfig):
        self.file = f
        self.config = config
        if f.has_tensor("output.weight"):  # the embedding is only looked up: read in place
            embd = f.tensor("token_embd.weight")
            self.token_embd = MappedRows(embd.type, embd.data, embd.shape, "token_embd.weight")
            self.output = self.matrix("output.weight")
        else:  # tied embeddings: the embedding matrix is also the head
            self.token_embd = self.output = self.matrix("token_embd.weight")
        self.output_norm = self.vector("output_norm.weight")

    # -- weights -------------------------------------------------------------------------
    def matrix(self, name: str) -> QuantMatrix:
        t = self.file.tensor(name)
        # A family with a fused forward keeps the file's blocks of the formats its arena holds as
        # they are; any other matrix is repacked now. Either way nothing reads these pages now
        # (the arena's copy maps back the pages it copies, and lets them go again).
        matrix = load_matrix(t.type, t.data, t.shape, name, keep_blocks=self.may_fuse())
        self.file.release_pages(t.data)
        return matrix

    def vector(self, name: str) -> np.ndarray:
        return np.asarray(self.file.tensor(name).data, dtype=np.float32)

    def optional_vector(self, name: str) -> np.ndarray | None:
        return self.vector(name) if self.file.has_tensor(name) else None

    def new_cache(self, n_ctx: int) -> KVCache:
        """An empty per-conversation cache of ``n_ctx`` positions (a family with recurrent
        state returns a cache that carries it too)."""
        return KVCache(self.config.kv_geometry, n_ctx)

    # -- the fused forward -----------------------------------------------------------------
    @classmethod
    def may_fuse(cls) -> bool:
        """Whether the family may build the fused forward (it defines ``step_layers``): a cold
        start then starts compiling it before the weights load (step_region.compile_ahead)."""
        return cls.step_layers is not DecoderModel.step_layers

    def step_layers(self) -> list[LayerWeights] | None:
        """Every layer's weights as the fused forward takes them; None: the family has none."""
        return None

    def rope_bases(self) -> tuple[float, ...]:
        """The RoPE bases the layers use; LayerWeights.rope_table indexes this."""
        return (self.config.rope_base,)

    def build_fused(self) -> FusedForward | None:
        layers = self.step_layers()
        if layers is None:
            return None
        neox = self.rope_style == ROPE_NEOX
        return FusedForward.build(
            layers, self.config, self.output, self.output_norm, self.step_flags, neox, self.file.release_pages
        )

    def row_plan(self, runs: Sequence[Run]) -> RowPlan:
        """Where the rows of ``runs`` go, with their RoPE angles and the rows whose logits come
        back (every row of an all-logits run, else its last)."""
        caches, positions, head_rows = [], [], []
        for run in runs:
            start, first_row = run.cache.n_positions, len(positions)
            caches += [run.cache] * len(run.tokens)
            positions += range(start, start + len(run.tokens))
            last = first_row + len(run.tokens)
            head_rows += range(first_row, last) if run.all_logits else [last - 1]
        positions = np.array(positions, np.int64)  # (N,)
        tables = [rope_angles(positions, self.config.n_rot, base) for base in self.rope_bases()]
        cos = np.ascontiguousarray(np.stack([c for c, _ in tables], axis=1))  # (N, tables, n_rot/2)
        sin = np.ascontiguousarray(np.stack([s for _, s in tables], axis=1))  # (N, tables, n_rot/2)
        return RowPlan(caches, positions, cos, sin, np.array(head_rows, np.int64))

    # -- forward ---------------------------------------------------------------------------
    def embed(self, tokens: np.ndarray) -> np.ndarray:
        return self.token_embd.take_rows(tokens)  # (n, n_embd)

    @abstractmethod
    def block(self, layer: int, x: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        """One transformer layer over x (n, n_embd) at positions start..start+n."""

    def forward(self, tokens: Sequence[int], cache: KVCache, all_logits: bool = False) -> np.ndarray:
        """Run ``tokens`` after what ``cache`` holds; return the last position's logits
        (vocab,) or, with ``all_logits``, every position's (n, vocab)."""
        return self.forward_runs([Run(cache, tokens, all_logits)])[0]

    def forward_runs(self, runs: Sequence[Run]) -> list[np.ndarray]:
        """Each run's tokens appended to its own cache, all in one forward; per run, the last
        position's logits (vocab,) or every position's (n, vocab). A row's logits are bitwise
        the same whichever runs it shares the forward with."""
        if len({id(run.cache) for run in runs}) != len(runs):
            raise ValueError("each run of a forward needs its own cache")
        for run in runs:
            if not len(run.tokens):
                raise ValueError("a run needs at least one token")
            run.cache.check_room(len(run.tokens))
        if self.fused is None:
            return [self.forward_layers(list(run.tokens), run.cache, run.all_logits) for run in runs]
        plan = self.row_plan(runs)
        tokens = np.concatenate([np.asarray(run.tokens, np.int64) for run in runs])  # (N,)
        logits = self.fused(self.embed(tokens), plan)  # (M, vocab)
        results, at = [], 0
        for run in runs:
            run.cache.commit(list(run.tokens))
            results.append(logits[at : at + run.n_logits] if run.all_logits else logits[at])
            at += run.n_logits
        return results

    def final_hidden(self, tokens: Sequence[int], cache: KVCache) -> np.ndarray:
        """Run ``tokens`` after what ``cache`` holds and return the last position's hidden
        state after the final norm, before the output head (n_embd,): the row the head would
        turn into logits. The forward's arithmetic is the one ``forward`` runs."""
        if not len(tokens):
            raise ValueError("a run needs at least one token")
        cache.check_room(len(tokens))
        if self.fused is None:
            residual = self._residual_layers(list(tokens), cache)
        else:
            plan = self.row_plan([Run(cache, tokens)])
            residual = self.fused.residual(self.embed(np.asarray(tokens, np.int64)), plan)
            cache.commit(list(tokens))
        return rms_norm(residual[-1], self.output_norm, self.config.norm_eps)

    def _residual_layers(self, tokens: list[int], cache: KVCache) -> np.ndarray:
        """The numpy layers' residual stream after the last layer (n, n_embd); commits tokens."""
        start = cache.n_positions
        x = self.embed(np.asarray(tokens, dtype=np.int64))  # (n, n_embd)
        for layer in range(self.config.n_layers):
            x = self.block(layer, x, cache, start)
        cache.commit(tokens)
        return x

    def forward_layers(self, tokens: list[int], cache: KVCache, all_logits: bool = False) -> np.ndarray:
        """``forward`` through the numpy layers (``block``): the path of families without a fused
        forward, and the reference the tests compare the fused one with."""
        x = self._residual_layers(tokens, cache)  # (n, n_embd)
        if not all_logits:
            x = x[-1:]
        logits = linear(self.output, rms_norm(x, self.output_norm, self.config.norm_eps))  # (n, vocab)
        return logits if all_logits else logits[0]

    # -- shared attention steps ------------------------------------------------------------
    def rope(self, x: np.ndarray, start: int, base: float | None = None) -> np.ndarray:
        """Rotate (n, heads, head_dim) at positions start..start+n."""
        c = self.config
        positions = np.arange(start, start + x.shape[0])
        cos, sin = rope_angles(positions, c.n_rot, c.rope_base if base is None else base)
        return apply_rope(x, cos, sin, self.rope_style)

    def split_heads(self, x: np.ndarray, n_heads: int) -> np.ndarray:
        return x.reshape(x.shape[0], n_heads, -1)  # (n, heads, head_dim)

    def attend(
        self,
        layer: int,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        cache: KVCache,
        start: int,
        scale: float | None = None,
        window: int = 0,
        rope_base: float | None = None,
    ) -> np.ndarray:
        """Rotate q (n, heads, hd) and k (n, kvh, hd), store k, v rows, attend with q;
        returns (n, n_heads * head_dim_v)."""
        if scale is None:
            scale = 1.0 / np.sqrt(self.config.head_dim_k)
        q, k = self.rope(q, start, rope_base), self.rope(k, start, rope_base)
        cache.write(layer, start, k, v)
        out = np.empty((q.shape[0], q.shape[1], v.shape[2]), np.float32)  # (n, heads, hd_v)
        attend_rows(
            np.ascontiguousarray(q, np.float32),
            cache.k_bits[layer],
            cache.v_bits[layer],
            start,
            window,
            np.float32(scale),
            out,
        )
        return out.reshape(out.shape[0], -1)
