"""Open a GGUF file: metadata as plain Python values, tensors memory-mapped.

The header is parsed here rather than with ``gguf.GGUFReader``: the reader builds a numpy
view per string, which takes ~30 s on Gemma 3's 262k-token vocabulary; this parser takes
well under a second. Type ids, value types and block sizes come from the ``gguf`` package.

Every failure a user can cause (wrong file, truncated download, an architecture or tensor
type we do not run) raises :class:`GGUFError` with a message naming the problem.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any, Protocol

import gguf
import numpy as np

from .gguf_strings import read_strings
from .load_options import LoadOptions

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

_SCALARS: dict[gguf.GGUFValueType, str] = {
    gguf.GGUFValueType.UINT8: "<B",
    gguf.GGUFValueType.INT8: "<b",
    gguf.GGUFValueType.UINT16: "<H",
    gguf.GGUFValueType.INT16: "<h",
    gguf.GGUFValueType.UINT32: "<I",
    gguf.GGUFValueType.INT32: "<i",
    gguf.GGUFValueType.FLOAT32: "<f",
    gguf.GGUFValueType.UINT64: "<Q",
    gguf.GGUFValueType.INT64: "<q",
    gguf.GGUFValueType.FLOAT64: "<d",
    gguf.GGUFValueType.BOOL: "<?",
}


class GGUFError(ValueError):
    """The file cannot be served; the message says why."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file, its bytes still in the memory map."""

    name: str
    type: gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order (..., rows, cols); cols is GGUF's ne[0]
    data: np.ndarray  # F32/F16 typed with `shape`; other types uint8 (..., rows, row_bytes)


class Borrower(Protocol):
    """Something that reads its tensor from the mapped file while serving."""

    @property
    def serving_bytes(self) -> int: ...


class GGUFFile:
    """A GGUF file opened read-only with its tensors memory-mapped."""

    def __init__(self, path: str | os.PathLike, options: LoadOptions | None = None):
        self.path = os.fspath(path)
        self.options = options or LoadOptions()  # how the models read the tensors (load_options.py)
        try:
            self._map = np.memmap(self.path, mode="r")
        except (OSError, ValueError) as exc:
            raise GGUFError(f"{self.path}: cannot open ({exc})") from exc
        reader = _HeaderReader(self.path, self._map)
        self.metadata: dict[str, Any] = reader.metadata
        self.tensors: dict[str, TensorInfo] = reader.tensors
        self.data_start: int = reader.data_start  # the header (metadata, tensor table) ends here
        # What keeps reading tensors from the map while serving (borrowed experts), each with
        # the memory it takes then (``serving_bytes``).
        self.borrowers: list[Borrower] = []

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: metadata has no general.architecture")
        return arch

    def arch_value(self, key: str, default: Any = None) -> Any:
        """Metadata ``<arch>.<key>``, e.g. ``arch_value("block_count")``."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise GGUFError(f"{self.path}: required metadata key {key!r} is missing")
        return self.metadata[key]

    def release_pages(self, view: np.ndarray | None = None) -> None:
        """Unmap the whole pages under ``view`` (a tensor's data), or of the whole file, from this
        process; the page cache keeps them. Once a matrix is repacked the engine reads its own
        arrays, and what still reads the file (tables only looked up, borrowed experts, K-quant
        blocks the fused step copies) maps back just the pages it touches."""
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        start, stop = 0, self._map.size
        if view is not None:
            start = view.__array_interface__["data"][0] - self._map.__array_interface__["data"][0]
            stop = start + view.nbytes
        first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE  # (pages wholly inside the view)
        last = stop // mmap.PAGESIZE * mmap.PAGESIZE if stop < self._map.size else stop
        if last > first:
            self._map._mmap.madvise(mmap.MADV_DONTNEED, first, last - first)

    def header_bytes(self) -> memoryview:
        """The raw header: magic, version, metadata and the tensor table."""
        return memoryview(self._map)[: self.data_start]

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: required tensor {name!r} is missing") from None

    def has_tensor(self, name: str) -> bool:
        return name in self.tensors


class _HeaderReader:
    """Walks the header once: magic, version, key/values, tensor infos."""

    def __init__(self, path: str, buf: np.ndarray):
        self.path, self.buf, self.pos = path, buf, 0
        self.raw = memoryview(buf)
        if bytes(self.raw[:4]) != GGUF_MAGIC:
            raise GGUFError(f"{path}: not a GGUF file (magic {bytes(self.raw[:4])!r})")
        self.pos = 4
        version = self._scalar("<I")
        if version not in (2, 3):
            raise GGUFError(f"{path}: unsupported GGUF version {version}")
        n_tensors, n_kv = self._scalar("<Q"), self._scalar("<Q")
        self.metadata = {}
        for _ in range(n_kv):
            key = self._string()
            self.metadata[key] = self._value(self._value_type())
        infos = [self._tensor_header() for _ in range(n_tensors)]
        align = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        self.data_start = data_start = -(-self.pos // align) * align
        self.tensors = {name: self._tensor(name, dims, t, data_start + off) for name, dims, t, off in infos}

    def _need(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            raise GGUFError(f"{self.path}: file is truncated inside the header")

    def _scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self._need(size)
        (value,) = struct.unpack_from(fmt, self.raw, self.pos)
        self.pos += size
        return value

    def _string(self) -> str:
        n = self._scalar("<Q")
        self._need(n)
        text = bytes(self.raw[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def _strings(self, count: int) -> list[str]:
        """``count`` strings decoded at once (gguf_strings.py): a vocabulary and its merges are
        300k of them, seconds of a model's load when read one ``_string`` call at a time."""
        read = read_strings(self.buf, self.pos, count)
        if read is None:
            raise GGUFError(f"{self.path}: file is truncated inside the header")
        strings, self.pos = read
        return strings

    def _value_type(self) -> gguf.GGUFValueType:
        code = self._scalar("<I")
        try:
            return gguf.GGUFValueType(code)
        except ValueError:
            raise GGUFError(f"{self.path}: corrupt header (value type {code})") from None

    def _value(self, vtype: gguf.GGUFValueType) -> Any:
        if vtype == gguf.GGUFValueType.STRING:
            return self._string()
        if vtype == gguf.GGUFValueType.ARRAY:
            item_type, count = self._value_type(), self._scalar("<Q")
            if item_type in _SCALARS:
                # Numeric arrays (scores, token types) stay numpy: one read, no loop.
                dtype = np.dtype(_SCALARS[item_type])
                self._need(count * dtype.itemsize)
                arr = np.frombuffer(self.raw, dtype, count, self.pos).copy()
                self.pos += count * dtype.itemsize
                return arr
            if item_type == gguf.GGUFValueType.STRING:
                return self._strings(count)
            return [self._value(item_type) for _ in range(count)]
        return self._scalar(_SCALARS[vtype])

    def _tensor_header(self) -> tuple[str, list[int], int, int]:
        name = self._string()
        n_dims = self._scalar("<I")
        dims = [self._scalar("<Q") for _ in range(n_dims)]
        type_id, offset = self._scalar("<I"), self._scalar("<Q")
        return name, dims, type_id, offset

    def _tensor(self, name: str, dims: list[int], type_id: int, start: int) -> TensorInfo:
        try:
            qtype = gguf.GGMLQuantizationType(type_id)
        except ValueError:
            raise GGUFError(f"{self.path}: tensor {name!r} has unknown type id {type_id}") from None
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        shape = tuple(reversed(dims))  # (..., rows, cols)
        if dims[0] % block:
            raise GGUFError(f"{self.path}: tensor {name!r} row of {dims[0]} is not whole {qtype.name} blocks")
        row_bytes = dims[0] // block * type_size
        nbytes = int(np.prod(shape[:-1], dtype=np.int64)) * row_bytes
        if start + nbytes > len(self.buf):
            raise GGUFError(
                f"{self.path}: file is truncated: tensor {name!r} needs bytes up to {start + nbytes}, "
                f"the file has {len(self.buf)}"
            )
        raw = self.buf[start : start + nbytes]
        if qtype == gguf.GGMLQuantizationType.F32:
            data = raw.view(np.float32).reshape(shape)
        elif qtype == gguf.GGMLQuantizationType.F16:
            data = raw.view(np.float16).reshape(shape)
        else:
            data = raw.reshape(*shape[:-1], row_bytes)
        return TensorInfo(name, qtype, shape, data)
