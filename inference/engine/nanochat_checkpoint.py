"""A nanochat checkpoint directory: ``model.safetensors`` + ``tokenizer.bin``.

The geometry is read from the tensor shapes, so no config file is needed: ``n_embd`` from
the embedding, the layer count from the ``transformer.h.{i}`` names, ``n_kv_head`` from the
last layer's value-embedding gate (one row per kv head; the last layer always has one) and
the head size from ``c_k``. (The reference port assumes a head size of 64; reading it from
the shapes serves the same files and also nanochat's larger models, whose heads are 128.)

Tensors may be F32, F16 or BF16 (the trainer's own checkpoints); everything becomes float32.
The safetensors container is read here (a JSON header, then raw little-endian data) because
numpy has no bfloat16.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .models.nanochat import NanochatConfig, NanochatLayer, NanochatModel, NanochatWeights
from .tokenizer.nanochat_bpe import NanochatTokenizer, NanochatTokenizerError

MODEL_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.bin"
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


class NanochatCheckpointError(ValueError):
    """A checkpoint directory that cannot be served; the message names the file and why."""


@dataclass(frozen=True)
class NanochatCheckpoint:
    """A loaded checkpoint: the model and its tokenizer."""

    directory: Path
    model: NanochatModel
    tokenizer: NanochatTokenizer

    @property
    def model_id(self) -> str:
        return self.directory.resolve().name


def load_checkpoint(directory: Path) -> NanochatCheckpoint:
    """Load ``directory``; NanochatCheckpointError names a missing file or a bad tensor."""
    directory = check_directory(directory)
    try:
        tokenizer = NanochatTokenizer.load(directory / TOKENIZER_FILE)
    except NanochatTokenizerError as exc:
        raise NanochatCheckpointError(str(exc)) from exc
    tensors = read_safetensors(directory / MODEL_FILE)
    config = infer_config(tensors, tokenizer.n_vocab, directory / MODEL_FILE)
    weights = build_weights(tensors, config, directory / MODEL_FILE)
    return NanochatCheckpoint(directory, NanochatModel(config, weights), tokenizer)


def check_directory(directory: Path) -> Path:
    """``directory`` if it holds both files; NanochatCheckpointError naming what is missing."""
    directory = Path(directory)
    if not directory.is_dir():
        raise NanochatCheckpointError(f"{directory}: not a directory (a nanochat checkpoint is a directory)")
    for name in (MODEL_FILE, TOKENIZER_FILE):
        if not (directory / name).is_file():
            needs = f"a nanochat checkpoint needs {MODEL_FILE} and {TOKENIZER_FILE}"
            raise NanochatCheckpointError(f"{directory}: no {name} ({needs})")
    return directory


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as float32."""
    data = Path(path).read_bytes()
    if len(data) < 8:
        raise NanochatCheckpointError(f"{path}: not a safetensors file (too short)")
    (header_len,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8 : 8 + header_len])
    except ValueError as exc:
        raise NanochatCheckpointError(f"{path}: unreadable safetensors header: {exc}") from exc
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = _tensor(data, base, name, info, path)
    return tensors


def _tensor(data: bytes, base: int, name: str, info: dict, path: Path) -> np.ndarray:
    dtype = _DTYPES.get(info["dtype"])
    if dtype is None:
        raise NanochatCheckpointError(
            f"{path}: tensor {name} has dtype {info['dtype']} (F32, F16 or BF16 expected)"
        )
    begin, end = info["data_offsets"]
    raw = np.frombuffer(
        data, dtype=dtype, count=(end - begin) // np.dtype(dtype).itemsize, offset=base + begin
    )
    if info["dtype"] == "BF16":  # the high half of a float32
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32).reshape(info["shape"])


def infer_config(tensors: dict[str, np.ndarray], vocab_size: int, path: Path) -> NanochatConfig:
    """The geometry the shapes imply (see the module docstring)."""
    wte = _need(tensors, "transformer.wte.weight", path)
    n_layer = 0
    while f"transformer.h.{n_layer}.attn.c_q.weight" in tensors:
        n_layer += 1
    if n_layer == 0:
        raise NanochatCheckpointError(f"{path}: no transformer.h.0.attn.c_q.weight (no layers)")
    n_kv_head = _need(tensors, f"transformer.h.{n_layer - 1}.attn.ve_gate.weight", path).shape[0]
    head_dim = _need(tensors, "transformer.h.0.attn.c_k.weight", path).shape[0] // n_kv_head
    n_head = _need(tensors, "transformer.h.0.attn.c_q.weight", path).shape[0] // head_dim
    if wte.shape[0] < vocab_size:
        raise NanochatCheckpointError(
            f"{path}: the embedding has {wte.shape[0]} rows, the tokenizer {vocab_size} tokens"
        )
    if n_head % n_kv_head:
        raise NanochatCheckpointError(f"{path}: {n_head} query heads do not group over {n_kv_head} kv heads")
    return NanochatConfig(vocab_size, n_layer, n_head, n_kv_head, wte.shape[1], head_dim)


def build_weights(tensors: dict[str, np.ndarray], config: NanochatConfig, path: Path) -> NanochatWeights:
    """The parameters, each checked against the shape the geometry gives it."""
    d, padded = config.n_embd, tensors["transformer.wte.weight"].shape[0]
    qo, kvo = config.n_head * config.head_dim, config.n_kv_head * config.head_dim

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        value = _need(tensors, name, path)
        if value.shape != shape:
            raise NanochatCheckpointError(f"{path}: {name} has shape {value.shape}, expected {shape}")
        return np.ascontiguousarray(value)

    layers = []
    for i in range(config.n_layer):
        p = f"transformer.h.{i}."
        ve = config.has_value_embedding(i)
        layers.append(
            NanochatLayer(
                c_q=get(p + "attn.c_q.weight", (qo, d)),
                c_k=get(p + "attn.c_k.weight", (kvo, d)),
                c_v=get(p + "attn.c_v.weight", (kvo, d)),
                c_proj=get(p + "attn.c_proj.weight", (d, qo)),
                c_fc=get(p + "mlp.c_fc.weight", (4 * d, d)),
                mlp_proj=get(p + "mlp.c_proj.weight", (d, 4 * d)),
                ve_gate=get(p + "attn.ve_gate.weight", (config.n_kv_head, 12)) if ve else None,
                value_embed=get(f"value_embeds.{i}.weight", (padded, kvo)) if ve else None,
            )
        )
    return NanochatWeights(
        wte=get("transformer.wte.weight", (padded, d)),
        lm_head=get("lm_head.weight", (padded, d)),
        resid_lambdas=get("resid_lambdas", (config.n_layer,)),
        x0_lambdas=get("x0_lambdas", (config.n_layer,)),
        smear_gate=get("smear_gate.weight", (1, 24)),
        smear_lambda=float(get("smear_lambda", (1,))[0]),
        backout_lambda=float(get("backout_lambda", (1,))[0]),
        layers=tuple(layers),
    )


def _need(tensors: dict[str, np.ndarray], name: str, path: Path) -> np.ndarray:
    value = tensors.get(name)
    if value is None:
        raise NanochatCheckpointError(f"{path}: no tensor {name}")
    return value
