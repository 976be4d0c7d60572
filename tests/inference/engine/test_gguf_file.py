"""GGUF loading: metadata, memory-mapped tensors, and a clear error for each bad file."""

import gguf
import numpy as np
import pytest

from inference.engine.engine import Engine
from inference.engine.families import family_of
from inference.engine.gguf_file import GGUFError, GGUFFile
from inference.model_files import default_model_path


def write_gguf(path, arch="llama", tensors=()):
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_embedding_length(256)
    writer.add_head_count(4)
    writer.add_token_list(["a", "b"])
    for name, data, raw_dtype in tensors:
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_reads_metadata_and_maps_tensors_of_the_default_model():
    f = GGUFFile(default_model_path())
    assert f.architecture == "llama" and f.arch_value("block_count") == 30
    assert len(f.metadata["tokenizer.ggml.tokens"]) == 49152
    embd = f.tensor("token_embd.weight")
    assert embd.type == gguf.GGMLQuantizationType.Q8_0 and embd.shape == (49152, 576)
    assert isinstance(embd.data, np.memmap) or isinstance(embd.data.base, np.memmap)
    ref = gguf.GGUFReader(str(default_model_path()))
    blk = next(t for t in ref.tensors if t.name == "blk.3.ffn_down.weight")
    assert np.array_equal(f.tensor("blk.3.ffn_down.weight").data, blk.data)


def test_not_a_gguf(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("this is not a model")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        Engine.load(path)


def test_missing_file(tmp_path):
    with pytest.raises(GGUFError, match="cannot open"):
        GGUFFile(tmp_path / "absent.gguf")


def test_truncated_file(tmp_path):
    data = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    path = write_gguf(tmp_path / "whole.gguf", tensors=[("w", data, None)])
    blob = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(blob[: len(blob) - 1000])
    with pytest.raises(GGUFError, match="truncated"):
        GGUFFile(cut)
    cut.write_bytes(blob[:40])
    with pytest.raises(GGUFError, match="truncated"):
        GGUFFile(cut)


def test_unknown_architecture(tmp_path):
    path = write_gguf(tmp_path / "odd.gguf", arch="mamba9")
    with pytest.raises(GGUFError, match="architecture 'mamba9' is not supported"):
        family_of(GGUFFile(path)).model(GGUFFile(path))


def test_unsupported_tensor_type(tmp_path):
    iq2 = gguf.GGMLQuantizationType.IQ2_XS
    block, size = gguf.GGML_QUANT_SIZES[iq2]
    raw = np.zeros((2, 256 // block * size), np.uint8)
    path = write_gguf(tmp_path / "iq.gguf", tensors=[("token_embd.weight", raw, iq2)])
    with pytest.raises(GGUFError, match="IQ2_XS is not supported"):
        family_of(GGUFFile(path)).model(GGUFFile(path))
