"""The fused forward: N rows (tokens) through every layer in one numba parallel region.

At 100+ tokens per second a token has ~10 ms for 30 layers, and each numpy call or parallel
region costs tens of microseconds (a sleeping OpenMP team takes that long to wake). So the
step's weights are gathered once at load into flat arenas described by int64 tables
(step_kernels.py), and ``FusedForward.__call__`` is a single kernel call per forward, of one
token or many (a prefill chunk, a lockstep batch, a verify run). Families with a layer the
kernel does not cover (experts, unequal k/v head sizes) keep their numpy ``block``, which is
also the reference the tests compare against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from ..jit import stage_calls
from ..kv_cache import KVCache
from ..quants.blocks import (
    BLOCK_Q4_1,
    BLOCK_Q4_K,
    BLOCK_Q5_0,
    BLOCK_Q6_K,
    BLOCK_Q8_0,
    FILE_FORMATS,
    block_row_bytes,
    encode,
    q80_packable,
)
from ..quants.formats import GGMLType
from ..quants.layout import GroupLayout
from ..quants.matrix import FloatMatrix, GroupedMatrix, QuantMatrix
from ..quants.nibbles import NibbleLayout, pack_nibbles, packable_offset
from ..quants.q41 import q41_packable
from ..quants.quint import DECODE_BLOCKS, quint_packable
from . import step_kernels as sk
from . import step_region
from .rowops import gelu_table

# At load, in Python: calling the kernel would compile it (into the cache) before the warm-up
# notice, which then reads the cache as filled.
row_bytes = block_row_bytes.py_func

SUPPORTED_GROUP_SIZES = (16, 32)  # every block format's
# The blocks of the formats a GroupedMatrix keeps the file's bytes of (matrix.BLOCK_NATIVE_TYPES).
NATIVE_KINDS = {
    GGMLType.Q8_0: BLOCK_Q8_0,
    GGMLType.Q5_0: BLOCK_Q5_0,
    GGMLType.Q4_1: BLOCK_Q4_1,
    GGMLType.Q4_K: BLOCK_Q4_K,
    GGMLType.Q6_K: BLOCK_Q6_K,
}


@dataclass(frozen=True)
class LayerWeights:
    """What the fused step needs of one layer. ``linears`` in slot order (q, k, v, out, gate,
    up, down), None for a slot a stacked matrix covers; norms: attn, post-attn, ffn, post-ffn
    (None where the family has none)."""

    linears: tuple[QuantMatrix | None, ...]
    biases: tuple[np.ndarray | None, ...]
    norms: tuple[np.ndarray | None, ...]
    qk_norms: tuple[np.ndarray, np.ndarray] | None
    window: int = 0
    rope_table: int = 0


class _Arena:
    """Flat arrays holding every matrix of the step; matrices are re-pointed at their slices
    so the weights are held once. A matrix that holds only the file's blocks (Q8_0, Q5_0,
    Q4_1, Q4_K, Q6_K: ``GroupedMatrix.blocks_only``) goes in as those bytes, copied from the
    file and nothing else: one-row products read them in registers (quants/blocks.py), tiles
    of several rows unpack them a tile at a time (tile_unpack.py); its table row has Q_OFF
    BLOCKS_ONLY. Other formats go in as int8 codes, 4-bit ones as packed nibbles
    (quants/nibbles.py), and where DECODE_BLOCKS also as blocks packed from those codes for
    one row's products (Q4_0 as Q5_0 blocks: quants/quint.py). ``release(part)`` is called on
    each file part once copied, so the file's pages leave the process as the arena fills."""

    def __init__(self, matrices: list[QuantMatrix], release=None):
        unique = list({id(m): m for m in matrices}.values())
        blocks_only = [m for m in unique if isinstance(m, GroupedMatrix) and m.blocks_only]
        grouped = [m for m in unique if isinstance(m, GroupedMatrix) and not m.blocks_only]
        floating = [m for m in unique if isinstance(m, FloatMatrix)]
        self.nibble_offsets = {id(m): packable_offset(m.layout.q, m.layout.group_size) for m in grouped}
        q_bytes = sum(m.layout.q.size // (1 if self.nibble_offsets[id(m)] is None else 2) for m in grouped)
        kinds = {id(m): self._block_kind(m) for m in grouped}
        kinds.update({id(m): NATIVE_KINDS[m.qtype] for m in blocks_only})
        self.block_kinds = {key: kind for key, kind in kinds.items() if kind is not None}
        self.quint = [m for m in grouped + blocks_only if id(m) in self.block_kinds]  # (with blocks)
        self.quint_at = q_bytes
        q_bytes += sum(m.rows * row_bytes(self.block_kinds[id(m)], m.cols) for m in self.quint)
        self.q = np.empty(q_bytes, np.int8)  # (int8 codes and packed nibbles of every matrix,)
        self.scales = np.empty(sum(m.layout.scales.size for m in grouped), np.float32)  # (groups,)
        n_mins = sum(m.layout.mins.size for m in grouped if m.layout.mins is not None)
        self.mins = np.empty(max(n_mins, 1), np.float32)  # (groups with mins,)
        self.floats = np.empty(max(sum(m.weights.size for m in floating), 1), np.float32)  # (float weights,)
        self.rows: dict[int, sk.LinearRow] = {}
        self._place_grouped(grouped)
        self._place_blocks(release)
        at = 0
        for m in floating:
            view = self.floats[at : at + m.weights.size].reshape(m.weights.shape)
            view[...] = m.weights
            m.weights = view
            self.rows[id(m)] = sk.LinearRow(
                q_off=at, rows=m.rows, cols=m.cols, shift=sk.FLOAT_SHIFT, kind=m.activation_kind
            )
            at += m.weights.size
        self.biases: list[np.ndarray] = []
        self.bias_at = 0

    def _place_grouped(self, matrices: list[GroupedMatrix]) -> None:
        q_at = s_at = m_at = 0
        for m in matrices:
            lay, nib = m.layout, self.nibble_offsets[id(m)]
            s_view = self.scales[s_at : s_at + lay.scales.size].reshape(lay.scales.shape)
            s_view[...] = lay.scales
            if nib is None:
                q_view = self.q[q_at : q_at + lay.q.size].reshape(lay.q.shape)
                q_view[...] = lay.q
            else:
                packed = self.q[q_at : q_at + lay.q.size // 2].view(np.uint8).reshape(m.rows, m.cols // 2)
                packed[...] = pack_nibbles(lay.q, nib)  # (rows, cols // 2)
            m_view, m_off = None, -1
            if lay.mins is not None:
                m_view, m_off = self.mins[m_at : m_at + lay.mins.size].reshape(lay.mins.shape), m_at
                m_view[...] = lay.mins
                m_at += lay.mins.size
            if nib is None:
                m.layout = GroupLayout(q_view, s_view, m_view, lay.group_size)
            else:
                m.layout = NibbleLayout(packed, nib, s_view, m_view, lay.group_size)
            self.rows[id(m)] = sk.LinearRow(
                q_off=q_at,
                rows=m.rows,
                cols=m.cols,
                shift=lay.group_shift,
                kind=m.activation_kind,
                s_off=s_at,
                m_off=m_off,
                nib=-1 if nib is None else nib,
            )
            q_at, s_at = q_at + lay.q.size // (1 if nib is None else 2), s_at + lay.scales.size

    def _block_kind(self, m: GroupedMatrix) -> int | None:
        """The blocks one-row products read the matrix as (the fewest bytes), or None."""
        lay, nib = m.layout, self.nibble_offsets[id(m)]
        if not DECODE_BLOCKS:
            return None
        if m.file_blocks is not None:
            return NATIVE_KINDS[m.qtype]
        if lay.mins is not None:
            ok = nib == 0 and q41_packable(lay.q, lay.scales, lay.mins, lay.group_size)
            return BLOCK_Q4_1 if ok else None
        if nib is not None:
            return None
        if quint_packable(lay.q, lay.scales, lay.group_size):
            return BLOCK_Q5_0
        return BLOCK_Q8_0 if q80_packable(lay.q, lay.scales, lay.group_size) else None

    def _place_blocks(self, release) -> None:
        at = self.quint_at
        for m in self.quint:
            kind, first = self.block_kinds[id(m)], at
            if m.blocks_only:
                self.rows[id(m)] = sk.LinearRow(
                    q_off=sk.BLOCKS_ONLY,
                    rows=m.rows,
                    cols=m.cols,
                    shift=m.group_size.bit_length() - 1,
                    kind=m.activation_kind,
                    m_off=0 if m.format.has_mins else -1,  # (>= 0: the blocks carry mins)
                )
            self.rows[id(m)] = self.rows[id(m)]._replace(quint=encode(at, kind))
            if m.file_blocks is not None:  # the file's bytes as they are
                for part in m.file_blocks:
                    self.q[at : at + part.size] = part.view(np.int8).ravel()
                    if release is not None:
                        release(part)
                    at += part.size
                assert at == first + m.rows * row_bytes(kind, m.cols)
                if m.blocks_only:  # the arena's copy from now on: the file's pages are let go
                    arena_bytes = self.q[first:at].view(np.uint8).reshape(m.rows, -1)
                    m.file_blocks = (arena_bytes,)
                continue
            lay, block_format = m.layout, FILE_FORMATS[kind]
            slab = max(1, (1 << 20) // m.cols)  # rows packed at a time: ~1M weights
            for r in range(0, m.rows, slab):
                part = slice(r, r + slab)
                mins = lay.mins[part] if block_format.has_mins else None
                blocks = block_format.pack_rows(lay.q[part], lay.scales[part], mins)  # (slab, row bytes)
                self.q[at : at + blocks.size] = blocks.view(np.int8).ravel()
                at += blocks.size
            assert at == first + m.rows * row_bytes(kind, m.cols)

    def row(self, matrix: GroupedMatrix | None, bias: np.ndarray | None) -> list[int]:
        """The table row of a matrix (zero rows for an empty slot), with its bias appended."""
        if matrix is None:
            return sk.EMPTY_LINEAR.columns()
        row = self.rows[id(matrix)]
        if bias is not None:
            row = row._replace(b_off=self.bias_at)
            self.biases.append(np.asarray(bias, np.float32))
            self.bias_at += len(bias)
        return row.columns()

    def bias_array(self) -> np.ndarray:
        return np.concatenate(self.biases) if self.biases else np.zeros(1, np.float32)  # (all biases,)


def fusable(matrix: QuantMatrix | None) -> bool:
    """Whether the fused step has a kernel for this matrix (None: an empty slot)."""
    if isinstance(matrix, GroupedMatrix):
        return matrix.group_size in SUPPORTED_GROUP_SIZES
    return matrix is None or isinstance(matrix, FloatMatrix)


class FusedForward:
    """A forward of N rows through the whole model in one kernel call (module docstring)."""

    def __init__(
        self, layers: list[LayerWeights], dims: np.ndarray, eps, scale, head, output_norm, release=None
    ):
        self.dims = dims
        matrices = [m for w in layers for m in w.linears if m is not None]
        arena = _Arena(matrices + [head], release)
        linears = np.array(
            [[arena.row(m, b) for m, b in zip(w.linears, w.biases, strict=True)] for w in layers], np.int64
        )  # (layers, slots, fields)
        head_row = np.array([arena.row(head, None)], np.int64)  # (1, fields)
        n_embd = layers[0].norms[0].shape[0]
        zeros = np.zeros(n_embd, np.float32)  # (n_embd,)
        norms = np.array(
            [[zeros if n is None else n for n in w.norms] for w in layers], np.float32
        )  # (L, 4, n_embd)
        hd = int(dims[sk.HEAD_DIM])
        qk_norms = np.array(
            [w.qk_norms if w.qk_norms is not None else np.zeros((2, hd), np.float32) for w in layers],
            np.float32,
        )  # (L, 2, hd)
        layer_info = np.array([[w.window, w.rope_table] for w in layers], np.int64)  # (L, 2)
        gelu = gelu_table() if dims[sk.FLAGS] & sk.GELU else np.zeros(1, np.float32)  # (65536,) or unused
        weights = sk.StepWeights(arena.q, arena.scales, arena.mins, arena.bias_array(), arena.floats, gelu)
        # What one decode step reads: every weight of every layer and the head, once (the
        # matrices it reads as Q5_0 blocks not as their int8 codes and scales).
        unread = sum(m.layout.nbytes for m in arena.quint if not m.blocks_only)  # (codes they skip)
        self.weight_bytes = sum(a.nbytes for a in weights[:5]) - unread
        self.vocab = int(head_row[0, sk.ROWS])
        self._prepared = False  # the stages' addresses ready for this model's argument types
        # What the stages' pointer calls reach for this model: only those kernels compiled.
        self.features = sk.model_features(linears, head_row, int(dims[sk.FLAGS]))
        # np.array copies: the mapped file's norm is read-only, and a read-only array would compile
        # its own variant of the norm kernels beside the writable one every other norm is.
        self.model = sk.StepModel(
            weights,
            linears,
            head_row,
            norms,
            qk_norms,
            np.array(output_norm, np.float32),
            layer_info,
            dims,
            np.float32(eps),
            np.float32(scale),
        )

    @classmethod
    def build(
        cls,
        layers: list[LayerWeights],
        config,
        head: QuantMatrix,
        output_norm,
        flags: int,
        neox: bool,
        release=None,
    ):
        """A FusedForward for these layers, or None if a matrix has no kernel here (block
        formats with groups of 16 or 32, and float matrices, have) or k and v heads differ in
        size. ``release(part)``: called on each file part the arena has copied (_Arena)."""
        if config.head_dim_k != config.head_dim_v:
            return None
        if not all(fusable(m) for w in layers for m in w.linears) or not fusable(head):
            return None
        dims = np.array(
            [config.n_heads, config.n_kv_heads, config.head_dim_k, config.n_ff, flags, int(neox)], np.int64
        )  # (6,)
        scale = 1.0 / np.sqrt(config.head_dim_k)
        return cls(layers, dims, config.norm_eps, scale, head, output_norm, release)

    def __call__(self, x: np.ndarray, rows: RowPlan) -> np.ndarray:
        """x (N, n_embd) of the rows ``rows`` describes -> logits (M, vocab) of its head rows.
        Writes every row's k and v into its cache (the caller commits the tokens)."""
        x = np.array(x, np.float32)  # (N, n_embd) updated in place
        logits = np.empty((rows.head_rows.shape[0], self.vocab), np.float32)  # (M, vocab)
        self._forward(numba.get_num_threads(), x, rows.kernel_rows(), logits)
        return logits

    def residual(self, x: np.ndarray, rows: RowPlan) -> np.ndarray:
        """x (N, n_embd) -> the residual stream after the last layer (N, n_embd), before the
        final norm: the same kernel with no head rows, so no logits are computed."""
        x = np.array(x, np.float32)  # (N, n_embd) updated in place
        no_logits = np.empty((0, self.vocab), np.float32)  # (0, vocab)
        plan = RowPlan(rows.caches, rows.positions, rows.cos, rows.sin, np.empty(0, np.int64))
        self._forward(numba.get_num_threads(), x, plan.kernel_rows(), no_logits)
        return x

    def _forward(self, n_threads: int, x: np.ndarray, rows: sk.StepRows, logits: np.ndarray) -> None:
        """step_region.forward_rows with its scratch. The first call makes the stages' addresses
        ready (stage_calls.py: compiled, or loaded from numba's cache); later calls skip that
        (~0.4 ms of typing the arguments): every call passes the same types, the arrays being
        built here with fixed dtypes and layouts."""
        scratch, counters = step_region.new_scratch(n_threads, x, self.model, rows)
        args = (n_threads, x, self.model, rows, logits, scratch, counters)
        if not self._prepared:
            stage_calls.prepare(step_region.forward_rows, args, self.features)
            self._prepared = True
        step_region.forward_rows(*args)


@dataclass(frozen=True)
class RowPlan:
    """The rows of one fused forward: where each goes (its cache and position), its RoPE
    angles, and which rows' logits come back. The caches must stay alive during the call."""

    caches: list[KVCache]  # (N,) one per row; a cache may hold several consecutive rows
    positions: np.ndarray  # (N,) int64
    cos: np.ndarray  # (N, tables, n_rot/2) float32
    sin: np.ndarray  # (N, tables, n_rot/2) float32
    head_rows: np.ndarray  # (M,) int64: rows whose logits are wanted, in order

    def kernel_rows(self) -> sk.StepRows:
        # Each cache's addresses once (a prefill's rows share one cache): ``.ctypes`` builds
        # Python objects, ~1 us each and work for the garbage collector.
        unique = {id(c): c for c in self.caches}
        rows = {key: [c.k_bits.ctypes.data, c.v_bits.ctypes.data, c.n_ctx] for key, c in unique.items()}
        table = np.array([rows[id(c)] for c in self.caches], np.int64)  # (N, 3)
        return sk.StepRows(self.positions, table, self.cos, self.sin, self.head_rows)
