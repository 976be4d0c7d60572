"""The common in-memory layout every block format is repacked into at load time.

Kernels read one row as a long run of int8 values with a float32 scale (and min) per group
of G weights, looked up as ``scales[r, j >> log2(G)]``. numba vectorizes that single long
loop; walking the file's own block structure (short inner loops, nibble unpacking) it does
not. The price is memory: 1.125-1.5 bytes per weight instead of 0.56-0.69 for 4-5 bit files.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .formats import BlockFormat

# Rows are unpacked in slabs of about this many weights: big enough that numpy's per-call
# overhead vanishes, small enough that the temporaries stay in cache and memory stays flat.
_SLAB_WEIGHTS = 1 << 20

# Symmetric formats pass this instead of a mins array so every kernel has one signature.
NO_MINS = np.zeros((0, 0), np.float32)


class GroupArrays:
    """What every layout of grouped codes offers the kernels: ``q`` (rows, cols) int8, ``scales``
    and ``mins`` (rows, cols // group_size) float32 (mins None for symmetric formats)."""

    q: np.ndarray
    scales: np.ndarray
    mins: np.ndarray | None
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, cols) of the matrix, without reading the codes."""
        rows, groups = self.scales.shape
        return rows, groups * self.group_size

    @property
    def group_shift(self) -> int:
        return self.group_size.bit_length() - 1

    @property
    def has_mins(self) -> bool:
        return self.mins is not None

    @property
    def kernel_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(q, scales, mins-or-NO_MINS) as the numba kernels take them."""
        return self.q, self.scales, NO_MINS if self.mins is None else self.mins

    @property
    def nbytes(self) -> int:
        """Bytes held: the codes as stored, the scales and the mins."""
        return self.code_bytes + self.scales.nbytes + (0 if self.mins is None else self.mins.nbytes)

    @property
    def code_bytes(self) -> int:
        return self.q.nbytes


@dataclass(frozen=True)
class GroupLayout(GroupArrays):
    """int8 values with float32 per-group scales (and mins): weight = q * scale + min."""

    q: np.ndarray  # (rows, cols) int8
    scales: np.ndarray  # (rows, cols // group_size) float32
    mins: np.ndarray | None  # (rows, cols // group_size) float32, or None
    group_size: int


def repack(fmt: type[BlockFormat], data: np.ndarray, cols: int) -> GroupLayout:
    """File bytes (rows, row_bytes) uint8 of format ``fmt`` -> a GroupLayout.

    Works through slabs of rows so that large tensors (embedding tables of 100M+ weights)
    never materialize more than one slab of temporaries.
    """
    rows = data.shape[0]
    groups_per_row = cols // fmt.group_size
    q = np.empty((rows, cols), np.int8)  # (rows, cols)
    scales = np.empty((rows, groups_per_row), np.float32)  # (rows, cols // G)
    mins = np.empty((rows, groups_per_row), np.float32) if fmt.has_mins else None  # (rows, cols // G)
    slab_rows = max(1, _SLAB_WEIGHTS // max(cols, 1))
    for start in range(0, rows, slab_rows):
        stop = min(rows, start + slab_rows)
        blocks = np.asarray(data[start:stop]).reshape(-1, fmt.type_size())  # (n_blocks, type_size)
        unpacked = fmt.unpack(blocks)
        q[start:stop] = unpacked.q.reshape(stop - start, cols)
        scales[start:stop] = unpacked.scales.reshape(stop - start, groups_per_row)
        if mins is not None:
            mins[start:stop] = unpacked.mins.reshape(stop - start, groups_per_row)
    return GroupLayout(q, scales, mins, fmt.group_size)


def dequantize_reference(layout: GroupLayout, row_ids: np.ndarray | None = None) -> np.ndarray:
    """Plain numpy dequantization of the given rows (all rows by default) -> (k, cols) float32."""
    q, scales, mins = layout.q, layout.scales, layout.mins
    if row_ids is not None:
        q, scales = q[row_ids], scales[row_ids]
        mins = None if mins is None else mins[row_ids]
    k, cols = q.shape
    grouped = q.reshape(k, -1, layout.group_size).astype(np.float32) * scales[:, :, None]  # (k, groups, G)
    if mins is not None:
        grouped += mins[:, :, None]
    return grouped.reshape(k, cols)
