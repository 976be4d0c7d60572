"""The cartridge file: safetensors with one key and one value tensor per layer.

Tensors (float32): ``layers.<i>.k`` / ``layers.<i>.v`` of shape ``[trainable_rows, kv_heads,
head_dim]`` and, when the first ``frozen_rows`` rows are frozen (the attention sink),
``layers.<i>.k_sink`` / ``layers.<i>.v_sink`` of shape ``[frozen_rows, kv_heads, head_dim]``.
The serving prefix of a layer is sink ++ trainable: ``p = frozen_rows + trainable_rows`` rows,
keys stored normed and rotated at positions ``0 .. p-1``.

Metadata (safetensors keeps str -> str): ``format``, ``model_fingerprint`` (hex of the model's
16-byte fingerprint), ``rows``, ``frozen_rows``, the geometry, and ``training`` (JSON: how the
cartridge was made — steps, learning rate, seed, corpus digest, losses).

Every value must be finite: a NaN or an infinity in one row poisons every attention score that
row takes part in, so a reader refuses the file naming the tensor.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from inference.engine.kv_cache import KVGeometry
from inference.engine.prefix import KVPrefix, PrefixMismatchError

FORMAT = "lmserve-cartridge/1"


class CartridgeFormatError(ValueError):
    """The file is not a readable cartridge (names the file and what is wrong)."""


@dataclass(eq=False)
class Cartridge:
    """A KV prefix with the identity of the model it belongs to and how it was made."""

    k: np.ndarray  # (n_layers, n_kv_heads, rows, head_dim_k) float32, sink rows first
    v: np.ndarray  # (n_layers, n_kv_heads, rows, head_dim_v) float32
    fingerprint: bytes  # the model's 16-byte fingerprint (inference/engine/fingerprint.py)
    frozen_rows: int = 0  # leading rows excluded from training
    training: dict = field(default_factory=dict)  # JSON-serialisable provenance

    @property
    def rows(self) -> int:
        return int(self.k.shape[2])

    @property
    def geometry(self) -> KVGeometry:
        return self.prefix().geometry

    def prefix(self) -> KVPrefix:
        return KVPrefix(self.k, self.v)

    def check_model(self, geometry: KVGeometry, fingerprint: bytes, name: str = "cartridge") -> None:
        """Raise PrefixMismatchError when this cartridge was made for another model."""
        if self.geometry != geometry:
            raise PrefixMismatchError(
                f"{name}: KV geometry {self.geometry} does not match the model's {geometry}"
            )
        if self.fingerprint != fingerprint:
            raise PrefixMismatchError(
                f"{name}: built for the model with fingerprint {self.fingerprint.hex()}, "
                f"but the loaded model's is {fingerprint.hex()}"
            )


def save_cartridge(path: str | os.PathLike, cartridge: Cartridge) -> Path:
    """Write atomically (a temporary file renamed into place): a reader never sees half a file."""
    path = Path(path)
    frozen = cartridge.frozen_rows
    tensors: dict[str, np.ndarray] = {}
    for i in range(cartridge.k.shape[0]):
        k = np.ascontiguousarray(cartridge.k[i].transpose(1, 0, 2), np.float32)  # (rows, kvh, hd)
        v = np.ascontiguousarray(cartridge.v[i].transpose(1, 0, 2), np.float32)  # (rows, kvh, hd)
        if frozen:
            tensors[f"layers.{i}.k_sink"], tensors[f"layers.{i}.v_sink"] = k[:frozen], v[:frozen]
        tensors[f"layers.{i}.k"], tensors[f"layers.{i}.v"] = k[frozen:], v[frozen:]
    g = cartridge.geometry
    metadata = {
        "format": FORMAT,
        "model_fingerprint": cartridge.fingerprint.hex(),
        "rows": str(cartridge.rows),
        "frozen_rows": str(frozen),
        "n_layers": str(g.n_layers),
        "kv_heads": str(g.n_kv_heads),
        "head_dim_k": str(g.head_dim_k),
        "head_dim_v": str(g.head_dim_v),
        "training": json.dumps(cartridge.training, sort_keys=True),
    }
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save_file(tensors, str(tmp), metadata=metadata)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_cartridge(path: str | os.PathLike) -> Cartridge:
    """Read a cartridge file; CartridgeFormatError names the file and what is wrong (not a
    safetensors file, not a cartridge, a tensor missing, a value that is NaN or infinite)."""
    path = Path(path)
    if not path.is_file():
        raise CartridgeFormatError(f"{path}: no such cartridge file")
    try:
        with open(path, "rb") as fh:
            header_len = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(header_len)) if 0 < header_len < 1 << 26 else None
        tensors = load_file(str(path))
    except (OSError, ValueError, SafetensorError) as exc:
        raise CartridgeFormatError(f"{path}: not a safetensors file ({exc})") from exc
    meta = (header or {}).get("__metadata__") or {}
    if meta.get("format") != FORMAT:
        raise CartridgeFormatError(
            f"{path}: not a cartridge (format {meta.get('format')!r}, expected {FORMAT!r})"
        )
    try:
        n_layers, frozen = int(meta["n_layers"]), int(meta["frozen_rows"])
        fingerprint = bytes.fromhex(meta["model_fingerprint"])
        training = json.loads(meta.get("training") or "{}")
        ks, vs = [], []
        for i in range(n_layers):
            parts_k = ([tensors[f"layers.{i}.k_sink"]] if frozen else []) + [tensors[f"layers.{i}.k"]]
            parts_v = ([tensors[f"layers.{i}.v_sink"]] if frozen else []) + [tensors[f"layers.{i}.v"]]
            ks.append(np.concatenate(parts_k).transpose(1, 0, 2))  # (kvh, rows, hd)
            vs.append(np.concatenate(parts_v).transpose(1, 0, 2))  # (kvh, rows, hd)
        k = np.ascontiguousarray(np.stack(ks), np.float32)  # (L, kvh, rows, hd_k)
        v = np.ascontiguousarray(np.stack(vs), np.float32)  # (L, kvh, rows, hd_v)
    except (KeyError, ValueError) as exc:
        raise CartridgeFormatError(f"{path}: incomplete or inconsistent cartridge ({exc})") from exc
    if k.shape[2] != int(meta.get("rows", -1)):
        raise CartridgeFormatError(
            f"{path}: metadata says {meta.get('rows')} rows, tensors hold {k.shape[2]}"
        )
    _refuse_non_finite(path, tensors, n_layers, frozen)
    return Cartridge(k, v, fingerprint, frozen, training)


def _refuse_non_finite(path: Path, tensors: dict[str, np.ndarray], n_layers: int, frozen: int) -> None:
    """Raise CartridgeFormatError naming the first tensor that holds a NaN or an infinity. One
    such value poisons every attention score its row takes part in: served, the replies come
    out empty, so the file is refused instead."""
    kinds = ("k_sink", "v_sink", "k", "v") if frozen else ("k", "v")
    for name in (f"layers.{i}.{kind}" for i in range(n_layers) for kind in kinds):
        bad = tensors[name].size - int(np.count_nonzero(np.isfinite(tensors[name])))
        if bad:
            values = "value" if bad == 1 else "values"
            raise CartridgeFormatError(f"{path}: {bad} non-finite {values} (NaN or infinity) in {name}")
