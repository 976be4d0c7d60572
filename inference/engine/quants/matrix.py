"""Weight matrices ready for products, built from a GGUF tensor's raw bytes by ``load_matrix``."""

from __future__ import annotations

from abc import ABC, abstractmethod

import gguf
import numpy as np

from ..gguf_file import GGUFError
from . import kquants, ternary  # noqa: F401  (defining the classes registers them in FORMATS)
from .activations import ACTIVATION_ROUNDING
from .dequant import dequantize_rows
from .formats import FORMATS, GGMLType
from .layout import GroupLayout, repack
from .matmul import float_matmul, matmul
from .matvec import matvec
from .quantize import ACTIVATION_KIND

FLOAT_TYPES = frozenset({GGMLType.F32, GGMLType.F16, GGMLType.BF16})
SUPPORTED_TYPES = frozenset(FLOAT_TYPES | FORMATS.keys())
# Formats the fused step reads as the file packs them, one row (quants/blocks.py) or a tile of
# rows unpacked at a time (fused/tile_unpack.py): a matrix of these keeps the file's bytes only,
# and builds the int8 layout the numpy path reads the first time that path asks for it.
BLOCK_NATIVE_TYPES = frozenset({GGMLType.Q8_0, GGMLType.Q5_0, GGMLType.Q4_1, GGMLType.Q4_K, GGMLType.Q6_K})


class QuantMatrix(ABC):
    """A 2-D weight matrix W (rows, cols), held in a layout the product kernels read fast."""

    rows: int
    cols: int
    qtype: GGMLType
    nbytes: int  # memory held after repacking

    @abstractmethod
    def matvec(self, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        """W @ x (+ bias): x (cols,) float32 -> (rows,) float32."""

    @abstractmethod
    def matmul(self, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        """x @ W.T (+ bias): x (n, cols) float32 -> (n, rows) float32."""

    @abstractmethod
    def take_rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (k,) dequantized -> (k, cols) float32 (embedding lookup)."""

    def dequantize(self) -> np.ndarray:
        """All of W as float32 (rows, cols)."""
        return self.take_rows(np.arange(self.rows))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.qtype.name}, {self.rows}x{self.cols}, {self.nbytes} bytes)"


class GroupedMatrix(QuantMatrix):
    """A block-quantized matrix: the file's blocks, or int8 values with float32 group scales
    (and mins) repacked from them (layout.py), or both.

    Products first round the activations as ggml does for this format (activations.py), so
    results agree with llama.cpp's to float noise. ``file_blocks``: the blocks (rows, row bytes)
    uint8 in row order (several parts once stacked), for the formats of BLOCK_NATIVE_TYPES;
    their ``layout`` is built from them on first use (the numpy path, tests), and a matrix
    the fused step holds never needs it (``blocks_only``)."""

    def __init__(
        self,
        qtype: GGMLType,
        layout: GroupLayout | None = None,
        file_blocks: tuple[np.ndarray, ...] | None = None,
    ):
        if layout is None and not file_blocks:
            raise ValueError("a GroupedMatrix needs its layout or its file blocks")
        self.qtype, self._layout, self.file_blocks = qtype, layout, file_blocks
        self.format = FORMATS[qtype]
        self.group_size = self.format.group_size
        if layout is not None:
            self.rows, self.cols = layout.shape
        else:
            self.rows = sum(part.shape[0] for part in file_blocks)
            self.cols = file_blocks[0].shape[1] // self.format.type_size() * self.format.block_size
        self.activation_kind = ACTIVATION_KIND[qtype]

    @property
    def blocks_only(self) -> bool:
        """Whether the matrix holds just the file's blocks (no int8 layout built)."""
        return self._layout is None

    @property
    def layout(self) -> GroupLayout:
        """The int8 layout, repacked from the file's blocks the first time it is asked for."""
        if self._layout is None:
            parts = [repack(self.format, part, self.cols) for part in self.file_blocks]
            self._layout = parts[0] if len(parts) == 1 else _concatenate(parts)
        return self._layout

    @layout.setter
    def layout(self, value: GroupLayout) -> None:
        self._layout = value

    @property
    def nbytes(self) -> int:
        """Memory held: the layout's arrays, or the blocks where there is no layout."""
        if self._layout is None:
            return sum(part.nbytes for part in self.file_blocks)
        return self._layout.nbytes

    def matvec(self, x, bias=None):
        return matvec(self.layout, x, self.activation_kind, bias)

    def matmul(self, x, bias=None):
        return matmul(self.layout, x, self.activation_kind, bias)

    @staticmethod
    def can_stack(matrices: list[QuantMatrix]) -> bool:
        """Whether ``stack`` applies: all grouped, of one format and one row length."""
        first = matrices[0]
        return all(
            isinstance(m, GroupedMatrix) and m.qtype == first.qtype and m.cols == first.cols for m in matrices
        )

    @classmethod
    def stack(cls, matrices: list[GroupedMatrix]) -> GroupedMatrix:
        """The rows of several matrices of one format as one matrix, so that linears sharing an
        input (q/k/v, gate/up) round it once and run as one parallel kernel. Blocks stay
        blocks: the fused step places the parts one after another."""
        parts = [m.file_blocks for m in matrices]
        file_blocks = None if any(p is None for p in parts) else tuple(b for p in parts for b in p)
        if file_blocks is not None and all(m.blocks_only for m in matrices):
            return cls(matrices[0].qtype, None, file_blocks)
        return cls(matrices[0].qtype, _concatenate([m.layout for m in matrices]), file_blocks)

    def take_rows(self, ids):
        if self._layout is None:
            blocks, cols = self._block_rows, self.cols
            return lookup_rows(self.rows, ids, lambda rows: dequantize_blocks(self.qtype, blocks(rows), cols))
        return dequantize_rows(self._layout, ids)

    def _block_rows(self, ids: np.ndarray) -> np.ndarray:
        """The blocks of rows ``ids`` (k,) (in range, not negative) -> (k, row bytes) uint8."""
        if len(self.file_blocks) == 1:
            return self.file_blocks[0][ids]
        return np.concatenate(self.file_blocks)[ids]


def _concatenate(layouts: list[GroupLayout]) -> GroupLayout:
    """The rows of several layouts of one format as one layout."""
    mins = None if layouts[0].mins is None else np.concatenate([lay.mins for lay in layouts])
    q = np.concatenate([lay.q for lay in layouts])  # (sum rows, cols)
    scales = np.concatenate([lay.scales for lay in layouts])  # (sum rows, groups)
    return GroupLayout(q, scales, mins, layouts[0].group_size)


def lookup_rows(rows: int, ids, dequantize, label: str = "matrix") -> np.ndarray:
    """Rows ``ids`` (k,) of a table of ``rows`` (negative ids count from the end) -> (k, cols)
    float32, where ``dequantize(unique ids)`` dequantizes just the distinct rows asked for."""
    ids = np.asarray(ids, np.int64).reshape(-1)  # (k,)
    if ids.size and (ids.min() < -rows or ids.max() >= rows):
        raise IndexError(f"{label}: row id out of range for {rows} rows")
    unique, where = np.unique(np.where(ids < 0, ids + rows, ids), return_inverse=True)
    return dequantize(unique)[where]  # (k, cols)


def dequantize_blocks(qtype: GGMLType, blocks: np.ndarray, cols: int) -> np.ndarray:
    """Blocks (k, row bytes) uint8 -> (k, cols) float32: repacked, then dequantized by the
    kernel ``dequantize_rows`` runs on a whole layout (the same bits)."""
    return dequantize_rows(repack(FORMATS[qtype], blocks, cols), np.arange(blocks.shape[0]))


class FloatMatrix(QuantMatrix):
    """An F32/F16/BF16 matrix held as float32; each product row is summed in one fixed order."""

    def __init__(self, qtype: GGMLType, weights: np.ndarray):
        self.qtype, self.weights = qtype, weights  # (rows, cols) float32
        self.rows, self.cols = weights.shape
        self.nbytes = weights.nbytes
        self.round_activations = ACTIVATION_ROUNDING[qtype]
        self.activation_kind = ACTIVATION_KIND[qtype]

    def matvec(self, x, bias=None):
        x = np.asarray(x, np.float32)
        if x.shape != (self.cols,):
            raise ValueError(f"matvec expects x of shape ({self.cols},), got {x.shape}")
        out = float_matmul(self.weights, self.round_activations(x).values[None])[0]  # (rows,)
        return out if bias is None else out + bias

    def matmul(self, x, bias=None):
        x = np.asarray(x, np.float32)
        if x.ndim != 2 or x.shape[1] != self.cols:
            raise ValueError(f"matmul expects x of shape (n, {self.cols}), got {x.shape}")
        out = float_matmul(self.weights, self.round_activations(x).values)  # (n, rows)
        return out if bias is None else out + bias

    def take_rows(self, ids):
        return self.weights[np.asarray(ids, np.int64).reshape(-1)]

    def dequantize(self):
        return np.array(self.weights)


def load_matrix(
    qtype: GGMLType | int,
    data: np.ndarray,
    shape: tuple[int, int],
    name: str = "",
    keep_blocks: bool = False,
) -> QuantMatrix:
    """Build a QuantMatrix from a tensor's raw data as ``GGUFFile`` exposes it.

    ``data`` is (rows, row_bytes) uint8 or, for F32/F16, typed (rows, cols); ``shape`` is
    (rows, cols) in numpy order. 3-D tensors (experts) are sliced by the caller. Raises
    GGUFError naming the tensor for an unsupported type or bytes that do not fit the shape.
    ``keep_blocks``: a format of BLOCK_NATIVE_TYPES keeps ``data`` (the fused step's arena
    copies it) and builds no layout unless the numpy path asks; otherwise the matrix is
    repacked now and keeps no reference to ``data``.
    """
    label = name or "tensor"
    try:
        qtype = gguf.GGMLQuantizationType(qtype)
    except ValueError:
        raise GGUFError(f"{label}: tensor type id {qtype} is not supported") from None
    if qtype not in SUPPORTED_TYPES:
        raise GGUFError(f"{label}: tensor type {qtype.name} is not supported")
    if len(shape) != 2:
        raise GGUFError(f"{label}: expected a 2-D tensor, got shape {tuple(shape)}")
    rows, cols = (int(n) for n in shape)
    if qtype in FLOAT_TYPES:
        return FloatMatrix(qtype, _float_weights(qtype, np.asarray(data), rows, cols, label))
    fmt = FORMATS[qtype]
    if cols % fmt.block_size:
        raise GGUFError(f"{label}: row of {cols} is not whole {qtype.name} blocks of {fmt.block_size}")
    expected = (rows, cols // fmt.block_size * fmt.type_size())
    if data.dtype != np.uint8 or data.shape != expected:
        raise GGUFError(
            f"{label}: {qtype.name} data should be uint8 {expected}, got {data.dtype} {data.shape}"
        )
    if keep_blocks and qtype in BLOCK_NATIVE_TYPES:
        return GroupedMatrix(qtype, None, (data,))
    return GroupedMatrix(qtype, repack(fmt, data, cols))


_FLOAT_FILE_DTYPES = {
    GGMLType.F32: np.dtype("<f4"),
    GGMLType.F16: np.dtype("<f2"),
    GGMLType.BF16: np.dtype("<u2"),
}


def _float_weights(qtype: GGMLType, data: np.ndarray, rows: int, cols: int, label: str) -> np.ndarray:
    """F32/F16/BF16 data, typed or raw bytes -> (rows, cols) float32 (F32 stays a view)."""
    file_dtype = _FLOAT_FILE_DTYPES[qtype]
    if data.dtype == np.uint8 and data.ndim == 2 and data.shape[1] == cols * file_dtype.itemsize:
        data = np.ascontiguousarray(data).view(file_dtype)
    if qtype == GGMLType.BF16 and data.dtype == np.int16:
        data = data.view(file_dtype)
    if data.shape != (rows, cols) or data.dtype != file_dtype:
        raise GGUFError(
            f"{label}: {qtype.name} data of {data.dtype} {data.shape} does not fit ({rows}, {cols})"
        )
    if qtype == GGMLType.BF16:
        # bfloat16 is the top half of a float32.
        return (data.astype(np.uint32) << 16).view(np.float32)  # (rows, cols)
    return np.ascontiguousarray(data, dtype=np.float32)  # (rows, cols)
