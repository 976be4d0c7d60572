"""A model's identity as 16 bytes: what files derived from one model (KV sidecars, cartridges)
record so that they are never used with another.

Names and shapes are not enough: a fine-tune, or base versus instruct, shares every metadata
key and tensor shape with its parent. The digest covers the whole header (metadata and tensor
table) and three samples (start, middle, end) of every tensor's bytes, so any retrained weight
matrix changes it, while computing it touches a few pages per tensor (milliseconds at load).
"""

from __future__ import annotations

import hashlib

import numpy as np

from .gguf_file import GGUFFile

SAMPLE_BYTES = 4096  # per sample; three samples per tensor
FINGERPRINT_BYTES = 16


def model_fingerprint(file: GGUFFile) -> bytes:
    """The 16-byte BLAKE2b fingerprint of ``file`` (header plus sampled tensor bytes)."""
    digest = hashlib.blake2b(digest_size=FINGERPRINT_BYTES)
    digest.update(file.header_bytes())
    for name in sorted(file.tensors):
        raw = file.tensors[name].data.reshape(-1).view(np.uint8)
        for start in _sample_starts(raw.size):
            digest.update(raw[start : start + SAMPLE_BYTES])
    return digest.digest()


def _sample_starts(size: int) -> tuple[int, ...]:
    if size <= 3 * SAMPLE_BYTES:
        return (0,) if size <= SAMPLE_BYTES else (0, SAMPLE_BYTES, 2 * SAMPLE_BYTES)
    return (0, (size - SAMPLE_BYTES) // 2, size - SAMPLE_BYTES)
