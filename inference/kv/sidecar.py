"""The KV sidecar file: a conversation's cache rows on disk, restorable with no re-prefill.

Little-endian, append-only::

    magic "LMSKV003" | record count u32 | model fingerprint 16 bytes | layer count u32
    | dtype u32 (0 f16, 1 q8_0) | prefix rows u32 | prefix key length u32
    | per layer: kv heads u32, key head dim u32, value head dim u32 | prefix key (utf-8)
    | crc32 of the header u32
    then per position: token id i32 (-1 for a prefix row), for each layer that position's K row
    and V row, and the crc32 of the record's own bytes u32.

A cache behind a KV prefix (a cartridge, a fleet composition) stores the prefix's rows as its
first records, with the prefix's key in the header: the file is self-describing, and a restore
brings back the very prefix the conversation was saved with.

The record count is rewritten last, so an interrupted append leaves a valid shorter file, and a
torn tail (a record cut short) is dropped on load. The header CRC covers every field but the
count, so a corrupted header is told apart from a foreign one; the fingerprint
(``inference.engine.fingerprint``) tells the model that wrote the rows, since another model of
the same shape (a fine-tune) would read them as garbage; the record CRCs catch rows damaged
after writing, checked when a file is loaded, and so is every value being finite (checksums
hold over NaN rows written so, and a restore would poison every reply behind them). A file is
written under a temporary name (:func:`temporary_path`) and renamed into place; a failed write
removes its temporary. Rows are a (kv heads x head dim) slice of the cache in f16 (lossless for
a cache holding f16-rounded values) or q8_0 (blocks of 32 values: an f16 scale, then 32 int8).
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from inference.engine.kv_cache import KVCache, KVGeometry

MAGIC = b"LMSKV003"
OLD_MAGICS = (b"LMSKV001", b"LMSKV002")  # formats this version no longer reads
F16, Q8_0 = 0, 1
DTYPE_NAMES = {F16: "f16", Q8_0: "q8_0"}
Q8_BLOCK = 32
F16_EXPONENT = 0x7C00  # an f16 whose exponent bits are all set is an infinity or a NaN
COUNT_OFFSET = len(MAGIC)
FINGERPRINT_BYTES = 16
STATIC_OFFSET = COUNT_OFFSET + 4  # the checksummed part of the header starts here
PREFIX_ROW_TOKEN = -1  # the token id of a prefix row's record: no token stands behind it
MAX_KEY_BYTES = 4096


class SidecarError(ValueError):
    """The file is not a usable sidecar (bad magic, corrupted header)."""


@dataclass(frozen=True)
class SidecarHeader:
    """What a sidecar's rows look like and how many complete records it holds."""

    geometry: KVGeometry
    dtype: int
    count: int  # records: prefix rows and tokens
    fingerprint: bytes  # the model that wrote the rows
    prefix_rows: int = 0  # the first records are a prefix's rows, with no token behind them
    prefix_key: str = ""  # the prefix's key (PrefixChoice.key)

    @property
    def size(self) -> int:
        key = len(self.prefix_key.encode())
        return STATIC_OFFSET + FINGERPRINT_BYTES + 16 + 12 * self.geometry.n_layers + key + 4

    def row_bytes(self, n_values: int) -> int:
        if self.dtype == F16:
            return 2 * n_values
        return (n_values // Q8_BLOCK) * (2 + Q8_BLOCK)

    @property
    def record_dtype(self) -> np.dtype:
        g = self.geometry
        layer = [
            ("k", np.uint8, (self.row_bytes(g.n_kv_heads * g.head_dim_k),)),
            ("v", np.uint8, (self.row_bytes(g.n_kv_heads * g.head_dim_v),)),
        ]
        return np.dtype([("token", "<i4"), ("layers", layer, (g.n_layers,)), ("crc", "<u4")])

    def with_count(self, count: int) -> SidecarHeader:
        return replace(self, count=count)

    def encode(self) -> bytes:
        g = self.geometry
        if len(self.fingerprint) != FINGERPRINT_BYTES:
            raise ValueError(f"a model fingerprint is {FINGERPRINT_BYTES} bytes, got {len(self.fingerprint)}")
        key = self.prefix_key.encode()
        if len(key) > MAX_KEY_BYTES:
            raise ValueError(f"a prefix key is at most {MAX_KEY_BYTES} bytes, got {len(key)}")
        static = self.fingerprint + struct.pack("<IIII", g.n_layers, self.dtype, self.prefix_rows, len(key))
        static += struct.pack("<III", g.n_kv_heads, g.head_dim_k, g.head_dim_v) * g.n_layers
        static += key
        return MAGIC + struct.pack("<I", self.count) + static + struct.pack("<I", zlib.crc32(static))


HEADER_PREFIX = STATIC_OFFSET + FINGERPRINT_BYTES + 16  # the fields before the per-layer dims
MAX_LAYERS = 4096


def read_header(data: bytes) -> SidecarHeader:
    """Parse a header from the file's first bytes; raises SidecarError when it is corrupt."""
    if data[: len(MAGIC)] in OLD_MAGICS:
        raise SidecarError(f"an older sidecar format ({data[: len(MAGIC)].decode()}), not {MAGIC.decode()}")
    if data[: len(MAGIC)] != MAGIC or len(data) < HEADER_PREFIX:
        raise SidecarError("not a sidecar (bad magic)")
    (count,) = struct.unpack_from("<I", data, COUNT_OFFSET)
    fingerprint = bytes(data[STATIC_OFFSET : STATIC_OFFSET + FINGERPRINT_BYTES])
    fields = struct.unpack_from("<IIII", data, STATIC_OFFSET + FINGERPRINT_BYTES)
    n_layers, dtype, prefix_rows, key_len = fields
    dims_start = HEADER_PREFIX
    dims_end = dims_start + 12 * n_layers
    static_end = dims_end + key_len
    if n_layers < 1 or n_layers > MAX_LAYERS or key_len > MAX_KEY_BYTES or len(data) < static_end + 4:
        raise SidecarError(f"corrupted header (layer count {n_layers}, key length {key_len})")
    static = data[STATIC_OFFSET:static_end]
    (crc,) = struct.unpack_from("<I", data, static_end)
    if crc != zlib.crc32(static):
        raise SidecarError("corrupted header (checksum mismatch)")
    if dtype not in DTYPE_NAMES:
        raise SidecarError(f"unknown row dtype {dtype}")
    dims = set(struct.iter_unpack("<III", data[dims_start:dims_end]))
    if len(dims) != 1:
        raise SidecarError("per-layer geometries differ; this server's caches are uniform")
    kv_heads, head_dim_k, head_dim_v = dims.pop()
    try:
        key = bytes(data[dims_end:static_end]).decode()
    except UnicodeDecodeError as exc:
        raise SidecarError("corrupted header (prefix key is not UTF-8)") from exc
    geometry = KVGeometry(n_layers, kv_heads, head_dim_k, head_dim_v)
    return SidecarHeader(geometry, dtype, count, fingerprint, prefix_rows, key)


def open_sidecar(path: Path) -> tuple[SidecarHeader, np.memmap | None]:
    """The header and the complete records (a torn tail dropped); None when it has none."""
    with path.open("rb") as f:
        header = read_header(f.read(HEADER_PREFIX + 12 * MAX_LAYERS + MAX_KEY_BYTES + 4))
    record = header.record_dtype
    complete = (path.stat().st_size - header.size) // record.itemsize
    count = max(0, min(header.count, complete))
    header = header.with_count(count)
    if count == 0:
        return header, None
    return header, np.memmap(path, dtype=record, mode="r", offset=header.size, shape=(count,))


# -- row codecs ----------------------------------------------------------------------------
def encode_rows(rows: np.ndarray, dtype: int) -> np.ndarray:
    """(n, values) float32 -> (n, row bytes) uint8."""
    if dtype == F16:
        return rows.astype("<f2").view(np.uint8)
    blocks = rows.reshape(rows.shape[0], -1, Q8_BLOCK)  # (n, blocks, 32)
    scale = np.abs(blocks).max(axis=2) / 127.0  # (n, blocks)
    safe = np.where(scale == 0, 1.0, scale)
    quants = np.clip(np.rint(blocks / safe[..., None]), -127, 127).astype(np.int8)  # (n, blocks, 32)
    scale16 = scale.astype("<f2").view(np.uint8).reshape(rows.shape[0], -1, 2)  # (n, blocks, 2)
    packed = np.concatenate([scale16, quants.view(np.uint8)], axis=2)  # (n, blocks, 34)
    return packed.reshape(rows.shape[0], -1)


def decode_rows(data: np.ndarray, dtype: int) -> np.ndarray:
    """(n, row bytes) uint8 -> (n, values) float32."""
    data = np.ascontiguousarray(data)
    if dtype == F16:
        return data.view("<f2").astype(np.float32)
    packed = data.reshape(data.shape[0], -1, 2 + Q8_BLOCK)  # (n, blocks, 34)
    scale = np.ascontiguousarray(packed[..., :2]).view("<f2").astype(np.float32)  # (n, blocks, 1)
    quants = np.ascontiguousarray(packed[..., 2:]).view(np.int8).astype(np.float32)  # (n, blocks, 32)
    return (quants * scale).reshape(data.shape[0], -1)


def _records(cache: KVCache, start: int, end: int, header: SidecarHeader) -> np.ndarray:
    """Cache positions [start, end) (prefix rows included) as sidecar records."""
    g = cache.geometry
    n = end - start
    out = np.zeros(n, dtype=header.record_dtype)  # (n,) records
    p = cache.prefix_rows
    shadow = [PREFIX_ROW_TOKEN] * p + cache.tokens  # (positions,) a token id per row
    out["token"] = shadow[start:end]
    for layer in range(g.n_layers):
        # The cache holds float16; the Q8 encoding computes its scales in float32.
        k = cache.k[layer, :, start:end].transpose(1, 0, 2).reshape(n, -1).astype(np.float32)  # (n, kvh * hd)
        v = cache.v[layer, :, start:end].transpose(1, 0, 2).reshape(n, -1).astype(np.float32)  # (n, kvh * hd)
        out["layers"]["k"][:, layer] = encode_rows(k, header.dtype)
        out["layers"]["v"][:, layer] = encode_rows(v, header.dtype)
    raw = out.view(np.uint8).reshape(n, -1)  # (n, record bytes)
    out["crc"] = [zlib.crc32(row[:-4]) for row in raw]
    return out


def first_non_finite(records: np.ndarray, header: SidecarHeader) -> tuple[int, int] | None:
    """(record, layer) of the first record, in layer order, with a NaN or infinite value in its
    rows, or None. Read from the f16 bit patterns (the values, or q8_0's block scales: its int8
    codes are always finite), so nothing is decoded."""
    n = len(records)
    for layer in range(header.geometry.n_layers):
        for part in ("k", "v"):
            raw = np.ascontiguousarray(records["layers"][part][:, layer])  # (n, row bytes)
            if header.dtype == Q8_0:
                raw = np.ascontiguousarray(raw.reshape(n, -1, 2 + Q8_BLOCK)[..., :2]).reshape(n, -1)
            halves = raw.view("<u2")  # (n, f16 values)
            bad = ((halves & F16_EXPONENT) == F16_EXPONENT).any(axis=1)  # (n,) all-ones exponent
            if bad.any():
                return int(np.argmax(bad)), layer
    return None


def first_damaged(records: np.ndarray) -> int | None:
    """The index of the first record whose bytes fail its checksum, or None when all pass."""
    raw = records.view(np.uint8).reshape(len(records), -1)  # (n, record bytes)
    stored = records["crc"]
    for i in range(len(records)):
        if zlib.crc32(raw[i, :-4]) != stored[i]:
            return i
    return None


# -- writing -------------------------------------------------------------------------------
def temporary_path(path: Path) -> Path:
    """The name ``path`` is written under before it is renamed into place (``.NAME.tmp``)."""
    return path.with_name(f".{path.name}.tmp")


def write_sidecar(path: Path, cache: KVCache, fingerprint: bytes, dtype: int = F16) -> None:
    """Store every committed position of ``cache`` (its prefix rows and its tokens, rows of the
    model ``fingerprint`` names) at ``path``. Written under a temporary name and renamed into
    place, so no half-written file ever carries a loadable name; a write that fails (a full
    disk) removes its temporary before the error propagates."""
    n = cache.n_positions
    header = SidecarHeader(cache.geometry, dtype, n, fingerprint, cache.prefix_rows, cache.prefix_key)
    temp = temporary_path(path)
    try:
        with temp.open("wb") as f:
            f.write(header.encode())
            f.write(_records(cache, 0, n, header).tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def append_sidecar(path: Path, cache: KVCache) -> int:
    """Extend a sidecar whose tokens ``cache`` continues (behind the same prefix) with the
    positions it lacks; the count is rewritten only after the new records are on disk. Returns
    the new record count."""
    header, records = open_sidecar(path)
    old = header.count
    del records
    if (header.prefix_rows, header.prefix_key) != (cache.prefix_rows, cache.prefix_key):
        raise SidecarError("the cache runs behind another prefix than the file's")
    with path.open("r+b") as f:
        f.seek(header.size + old * header.record_dtype.itemsize)
        f.truncate()  # a torn tail from an earlier interrupted append
        f.write(_records(cache, old, cache.n_positions, header).tobytes())
        f.flush()
        os.fsync(f.fileno())
        f.seek(COUNT_OFFSET)
        f.write(struct.pack("<I", cache.n_positions))
        f.flush()
        os.fsync(f.fileno())
    return cache.n_positions


# -- reading -------------------------------------------------------------------------------
def sidecar_tokens(records: np.ndarray | None, header: SidecarHeader) -> list[int]:
    """The real tokens of a sidecar's records (its prefix rows skipped)."""
    return [] if records is None else records["token"][header.prefix_rows :].tolist()


def load_into(records: np.ndarray, header: SidecarHeader, cache: KVCache) -> None:
    """Replace ``cache``'s contents with the sidecar's positions, its prefix and the prefix's key
    included (no logits: the engine re-runs the last prompt token when a request is wholly
    cached). Raises SidecarError, the cache untouched, when a record fails its checksum, a
    value is NaN or infinite, or the file holds no token past its prefix."""
    g = cache.geometry
    if header.geometry != g:
        raise ValueError(f"sidecar geometry {header.geometry} does not fit the cache's {g}")
    n = min(len(records), cache.n_ctx)
    if n <= header.prefix_rows:
        raise SidecarError(f"{n} records hold no token past the {header.prefix_rows} prefix rows")
    damaged = first_damaged(records[:n])
    if damaged is not None:
        raise SidecarError(f"record {damaged} of {n} fails its checksum (damaged rows)")
    non_finite = first_non_finite(records[:n], header)
    if non_finite is not None:
        record, layer = non_finite
        raise SidecarError(f"record {record} of {n} holds a NaN or infinite value (layer {layer})")
    for layer in range(g.n_layers):
        k = decode_rows(records["layers"]["k"][:n, layer], header.dtype)  # (n, kvh * hd)
        v = decode_rows(records["layers"]["v"][:n, layer], header.dtype)  # (n, kvh * hd)
        cache.k[layer, :, :n] = k.reshape(n, g.n_kv_heads, g.head_dim_k).transpose(1, 0, 2)
        cache.v[layer, :, :n] = v.reshape(n, g.n_kv_heads, g.head_dim_v).transpose(1, 0, 2)
    cache.prefix_rows, cache.prefix_key = header.prefix_rows, header.prefix_key
    cache.tokens = records["token"][header.prefix_rows : n].tolist()
    cache.prefill_logits = None
