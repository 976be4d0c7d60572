"""A forward of N rows (tokens) through every layer and the head in one numba parallel region.

The rows may belong to different caches at different positions: one decode step (N = 1), a
prefill chunk (N rows of one cache), a lockstep batch (one row per cache) and a verify run
all take this one kernel, and a row's arithmetic does not depend on N or on the other rows.
Every output element of a product is the same integer group dot product (intdot.py) of the
row's own rounded input, and every norm, RoPE, attention and activation runs over one row in
one fixed order. So a row's logits are bitwise the same however it is batched.

Each thread runs ``run_stages``: the same list of stages, claiming work items from shared
counters (worksharing.py) and waiting for each stage to complete before the next. Per layer:

    PREP_QKV  per row: rms_norm(x), rounded per weight format    QKV   tiles of q|k|v rows
    KV        per (row, kv head): k norm, RoPE, f16 cache write of k and v
    ATTEND    per tile of rows x q heads of one kv head (step_attention.py): q norm, RoPE,
              attention over the rows' cache
    PREP_OUT, OUT (x += ..., or into ``proj``), OUT_POST per row: x += rms_norm(proj)
    PREP_FFN, FFN tiles of gate and up rows, SiLU(gate) * up or GELU(gate) * up
    PREP_DOWN, DOWN, FFN_POST

and at the end PREP_HEAD, HEAD for the rows whose logits are wanted. With one row every thread
rounds the input itself (no stage, no wait): cheaper than one more barrier per product.
Weights live in flat arenas, each linear described by a row of an int64 table (built by
keyword as a ``LinearRow``, read by the column numbers below). The kernel's inputs are named
tuples (``StepModel``, ``StepRows``).
"""

from __future__ import annotations

from collections import namedtuple
from typing import NamedTuple

import numba
import numpy as np

from ..jit.intrinsics import uint16_pointer
from ..jit.kernel_only import kernel_only
from ..jit.stage_calls import Sites, calls_from
from ..jit.worksharing import claim, mark_done, wait_done
from ..quants.quantize import round_row, round_row_int
from .kernels import rope_inplace, store_half
from .rowops import rms_norm_into

# Columns of the linear table: offsets into the arenas (-1: none), shape, format. A float
# matrix (F32/F16/BF16) has SHIFT 0 and Q_OFF into the float arena. NIB: -1 for int8 codes,
# else the weights are packed nibbles (quants/nibbles.py) stored plus this offset. QUINT: -1,
# or where in the q arena a one-row product reads the matrix as the file's blocks, and which
# (quants/blocks.py encode). Q_OFF BLOCKS_ONLY: the blocks are all the arena holds of the
# matrix (no codes, scales or mins: tiles unpack them, fused/tile_unpack.py), and M_OFF >= 0
# says only that the format has mins.
Q_OFF, ROWS, COLS, S_OFF, M_OFF, SHIFT, KIND, B_OFF, NIB, QUINT = range(10)
BLOCKS_ONLY = -1
FLOAT_SHIFT = 0
LINEAR_FIELDS = 10


class LinearRow(NamedTuple):
    """One matrix's row of the linear table, built by keyword; the kernels read it as int64
    columns, this tuple's fields in order (Q_OFF ... QUINT)."""

    q_off: int
    rows: int
    cols: int
    shift: int
    kind: int
    s_off: int = -1
    m_off: int = -1
    b_off: int = -1
    nib: int = -1
    quint: int = -1

    def columns(self) -> list[int]:
        """The row as the table's columns."""
        at = {Q_OFF: self.q_off, ROWS: self.rows, COLS: self.cols, S_OFF: self.s_off, M_OFF: self.m_off}
        at |= {SHIFT: self.shift, KIND: self.kind, B_OFF: self.b_off, NIB: self.nib, QUINT: self.quint}
        return [at[column] for column in range(LINEAR_FIELDS)]


# An empty slot (a layer without that matrix): no rows, so the kernels skip it.
EMPTY_LINEAR = LinearRow(q_off=0, rows=0, cols=0, shift=0, kind=0, s_off=0, m_off=0, b_off=0)
# Linear slots of a layer: q/k/v (or the stacked qkv in slot 0), output, gate/up (or stacked
# gate_up in slot 4), down. Unused slots have ROWS 0.
SLOT_Q, SLOT_OUT, SLOT_GATE, SLOT_UP, SLOT_DOWN = 0, 3, 4, 5, 6
# Stage numbers within a layer.
PREP_QKV, QKV, KV, ATTEND, PREP_OUT, OUT, OUT_POST, PREP_FFN, FFN, PREP_DOWN, DOWN, FFN_POST = range(12)
STAGES_PER_LAYER = 12
# Family switches in dims[FLAGS].
QK_NORM, POST_NORMS, GELU = 1, 2, 4
# dims: the int64 vector of sizes the kernel reads.
N_HEADS, N_KV, HEAD_DIM, N_FF, FLAGS, NEOX = range(6)
# Columns of StepRows.caches: the addresses of a row's cache arrays and their context length.
CACHE_K, CACHE_V, CACHE_CTX = range(3)
PREFETCH_BYTES = 3072
# Q5_0 blocks take more instructions a byte: two threads streaming 151936x896 of them ran at
# 34-39 Gweights/s prefetching 6-12 KB ahead against 22-23 at 3 KB (bench/lab/q5_stream.py).
QUINT_PREFETCH_BYTES = 12288
# How far ahead a K-quant quad's stream prefetches inside its loop (kblocks_ir.prefetch_share),
# at least: two threads streaming Q6_K rows of 2048-14336 columns (bench/lab/k_stream.py) ran
# 42-47 GB/s a CPU-second at 16-64 KB against 27-31 at 8 KB; two units of four rows when longer.
STRETCH_BYTES = 32768
# A stage's work items: step_items.py (one token row: large at the ends of a matrix, halving
# toward the middle; several: whole tiles, several tiles an item when the rows are few).
SOLO_ROWS = 1  # up to this many rows, each thread rounds every row's input itself
# numba compiles a kernel once per literal constant a call passes it (dot_tile(..., 0, ...,
# False) and dot_tile(..., 1, ..., True) were four variants of it and of the kernels inside):
# the stages pass these typed values, one variant serves every call (a cold start compiles less).
ADD, STORE = np.bool_(True), np.bool_(False)
SLOT0, SLOT1 = np.int64(0), np.int64(1)
COLUMN0 = np.int64(0)  # dot_run's out_at: written from the first column
UPWARD, DOWNWARD = np.bool_(False), np.bool_(True)  # dot_run's backward
# Features of a model (stage_calls.prepare's): kernels only some models reach are called through
# pointers added with these, so a cold start compiles them only for a model that has them.
FLOAT_MATRICES, GELU_FFN = "float matrices", "gelu ffn"

StepWeights = namedtuple("StepWeights", ["q", "scales", "mins", "bias", "floats", "gelu"])
StepModel = namedtuple(
    "StepModel",
    ["weights", "linears", "head", "norms", "qk_norms", "output_norm", "layer_info", "dims", "eps", "scale"],
)
# positions (N,); caches (N, 3) int64; cos, sin (N, tables, n_rot/2); head_rows (M,): which
# rows' logits the head computes, in order.
StepRows = namedtuple("StepRows", ["positions", "caches", "cos", "sin", "head_rows"])
# A thread's view of the rounded inputs: each (slots, rows, ...).
Rounded = namedtuple("Rounded", ["values", "ints", "int_scales", "sums"])


# round_inputs rounds a float matrix's input through a pointer (stage_calls.py).
ROUND_SITES = Sites("step_rounding")
ROUND_ROW_AT = ROUND_SITES.add(round_row, needs=FLOAT_MATRICES)
round_call = ROUND_SITES.call


def model_features(linears: np.ndarray, head: np.ndarray, flags: int) -> frozenset[str]:
    """The features (FLOAT_MATRICES, GELU_FFN) of a model with these linear tables (layers,
    slots, LINEAR_FIELDS) and (1, LINEAR_FIELDS) and dims[FLAGS]: what prepare() compiles for."""
    used = np.concatenate([linears.reshape(-1, LINEAR_FIELDS), head])  # (matrices, LINEAR_FIELDS)
    has_float = bool(np.any((used[:, ROWS] > 0) & (used[:, SHIFT] == FLOAT_SHIFT)))
    return frozenset([FLOAT_MATRICES] * has_float + [GELU_FFN] * bool(flags & GELU))


@numba.njit(cache=True)
def round_inputs(linears, x, rounded, n):
    """Round x into row n of every slot in ``linears`` (k, LINEAR_FIELDS) as its weight format
    wants (values, integer codes, their per-group scales, group sums)."""
    for k in range(linears.shape[0]):
        lin = linears[k]
        if lin[ROWS] == 0:
            continue
        cols, shift = lin[COLS], lin[SHIFT]
        values = rounded.values[k, n, :cols]
        if shift == FLOAT_SHIFT:  # group 1, no sums; through a pointer: only a float matrix needs it
            round_call(ROUND_ROW_AT, (lin[KIND], x, values, rounded.sums[k, n, :0], SLOT1, STORE))
        else:
            n_groups = cols >> shift
            round_row_int(
                lin[KIND],
                x,
                values,
                rounded.ints[k, n, :cols],
                rounded.int_scales[k, n, :n_groups],
                rounded.sums[k, n, :n_groups],
                1 << shift,
                lin[M_OFF] >= 0,
            )


calls_from(round_inputs, ROUND_SITES)  # prepare_stage calls it directly


@numba.njit(cache=True, inline="always")  # into prepare_stage: a cold start compiles one level fewer
def _prepare_row(src, norm, eps, linears, rounded, i, normed):
    if norm.shape[0]:
        rms_norm_into(src, norm, eps, normed)
        round_inputs(linears, normed, rounded, i)
    else:
        round_inputs(linears, src, rounded, i)


@kernel_only()
def prepare_stage(src, src_rows, norm, eps, linears, rounded, normed, solo, counters, stage):
    """Rounded row i := src[src_rows[i]], rms-normed by ``norm`` first if it has entries. With
    ``solo`` this thread does every row into its own buffers; else rows are shared out."""
    n = src_rows.shape[0]
    if solo:
        for i in range(n):
            _prepare_row(src[src_rows[i]], norm, eps, linears, rounded, i, normed)
        return
    claimed, done = counters
    i = claim(claimed, stage)
    while i < n:
        _prepare_row(src[src_rows[i]], norm, eps, linears, rounded, i, normed)
        mark_done(done, stage)
        i = claim(claimed, stage)
    wait_done(done, stage, n)


@numba.njit(cache=True)
def cache_arrays(caches, n, n_layers, dims):
    """Row n's cache k and v (layers, kv heads, ctx, head_dim) of f16 bits."""
    shape = (n_layers, dims[N_KV], caches[n, CACHE_CTX], dims[HEAD_DIM])
    k = numba.carray(uint16_pointer(caches[n, CACHE_K]), shape)
    v = numba.carray(uint16_pointer(caches[n, CACHE_V]), shape)
    return k, v


@kernel_only()
def kv_stage(qkv, qk_norm, eps, rows, rope, dims, layer, n_layers, counters, stage):
    """Per (row, kv head): norm and rotate k in place, write k and v as f16 at the row's
    position of its cache."""
    claimed, done = counters
    n_heads, n_kv, hd = dims[N_HEADS], dims[N_KV], dims[HEAD_DIM]
    k_first, v_first = n_heads * hd, (n_heads + n_kv) * hd
    n_items = qkv.shape[0] * n_kv
    item = claim(claimed, stage)
    while item < n_items:
        n, h = item // n_kv, item % n_kv
        k = qkv[n, k_first + h * hd : k_first + (h + 1) * hd]
        if dims[FLAGS] & QK_NORM:
            rms_norm_into(k, qk_norm, eps, k)
        rope_inplace(k, rows.cos[n, rope], rows.sin[n, rope], dims[NEOX] != 0)
        cache_k, cache_v = cache_arrays(rows.caches, n, n_layers, dims)
        pos = rows.positions[n]
        store_half(k, cache_k[layer, h, pos])
        store_half(qkv[n, v_first + h * hd : v_first + (h + 1) * hd], cache_v[layer, h, pos])
        mark_done(done, stage)
        item = claim(claimed, stage)
    wait_done(done, stage, n_items)


@kernel_only()
def add_normed_stage(x, proj, weight, eps, counters, stage):
    """Per row: x += rms_norm(proj) * weight (the post-norm residual)."""
    claimed, done = counters
    n = claim(claimed, stage)
    while n < x.shape[0]:
        total = 0.0
        for j in range(proj.shape[1]):
            total += np.float64(proj[n, j] * proj[n, j])
        scale = np.float32(1.0) / np.sqrt(np.float32(total / proj.shape[1]) + eps)
        for j in range(x.shape[1]):
            x[n, j] += (proj[n, j] * scale) * weight[j]
        mark_done(done, stage)
        n = claim(claimed, stage)
    wait_done(done, stage, x.shape[0])
