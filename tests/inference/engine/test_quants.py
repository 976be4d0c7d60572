"""Quant formats: the format table, dequantization against gguf's reference, the public API.

Dequantization must be bitwise equal to ``gguf.quants.dequantize`` (compared as uint32 bit
patterns, so even the sign of zero must match), on random blocks, on blocks quantized by
gguf, and on real tensors of the model files.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from inference.engine.gguf_file import GGUFError, GGUFFile
from inference.engine.quants import SUPPORTED_TYPES, FloatMatrix, GroupedMatrix, load_matrix
from inference.engine.quants.formats import FORMATS
from tests.fixtures.model_files import default_model_path, optional_model_path

Q = gguf.GGMLQuantizationType
BLOCK_TYPES = [
    *(Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0),
    *(Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K),
    *(Q.TQ1_0, Q.TQ2_0),
]
SCALE_FIELDS = ("d", "m", "dmin")  # the float16 fields of every format


def random_quant_bytes(qtype: Q, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random (rows, row_bytes) uint8 of ``qtype`` whose float16 fields are finite.

    Scale fields take normal, subnormal, zero and negative values; every other byte is random,
    so every bit of every packed code is exercised.
    """
    rng = np.random.default_rng(seed)
    fmt = FORMATS[qtype]
    n_blocks = rows * cols // fmt.block_size
    blocks = rng.integers(0, 256, (n_blocks, fmt.type_size()), dtype=np.uint8)
    special = np.array([0.0, -0.0, 6e-8, -3e-5, 1.0, -2.5, 0.125], np.float16)
    start = 0
    for field in fmt.fields:
        if field.name in SCALE_FIELDS:
            values = (rng.standard_normal(n_blocks) * 0.02).astype(np.float16)
            values[: len(special)] = special[: min(len(special), n_blocks)]
            blocks[:, start : start + 2] = values.view(np.uint8).reshape(n_blocks, 2)
        start += field.nbytes
    return blocks.reshape(rows, -1)


def assert_bitwise_equal(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.dtype == np.float32 and expected.dtype == np.float32
    assert got.shape == expected.shape
    mismatched = np.flatnonzero(got.view(np.uint32) != expected.view(np.uint32))
    assert mismatched.size == 0, f"{mismatched.size} values differ, first at flat index {mismatched[:5]}"


def gguf_reference(qtype: Q, data: np.ndarray) -> np.ndarray:
    return np.asarray(gguf.quants.dequantize(np.asarray(data), qtype), dtype=np.float32)


# ---- the format table ----


def test_supported_types_are_exactly_the_brief():
    assert set(FORMATS) == set(BLOCK_TYPES)
    assert SUPPORTED_TYPES == set(BLOCK_TYPES) | {Q.F32, Q.F16, Q.BF16}


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_format_fields_add_up_to_gguf_sizes(qtype):
    fmt = FORMATS[qtype]
    assert (fmt.block_size, fmt.type_size()) == gguf.GGML_QUANT_SIZES[qtype]
    names = [field.name for field in fmt.fields]
    assert len(names) == len(set(names))
    assert fmt.block_size % fmt.group_size == 0 and fmt.group_size in (16, 32)


# ---- dequantization equals gguf ----


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_dequantize_random_blocks_bitwise(qtype):
    rows, cols = 9, 2 * 256
    data = random_quant_bytes(qtype, rows, cols, seed=int(qtype))
    matrix = load_matrix(qtype, data, (rows, cols), "random")
    assert (matrix.rows, matrix.cols, matrix.qtype) == (rows, cols, qtype)
    assert_bitwise_equal(matrix.dequantize(), gguf_reference(qtype, data))


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q5_0, Q.Q8_0], ids=lambda t: t.name)
def test_pack_rows_gives_back_the_files_bytes(qtype):
    """The formats the fused forward streams as blocks are rebuilt from their unpacked codes,
    scales and mins byte for byte (random blocks: every code, signed zeros, subnormal scales)."""
    fmt = FORMATS[qtype]
    rows = random_quant_bytes(qtype, 3, 128)  # (3, row bytes) uint8
    unpacked = fmt.unpack_rows(rows)
    assert unpacked.q.shape == (3, 128) and unpacked.scales.shape == (3, 128 // fmt.group_size)
    np.testing.assert_array_equal(fmt.pack_rows(*unpacked), rows)


QUANTIZABLE = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.F16, Q.BF16]


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda t: t.name)
def test_dequantize_gguf_quantized_bitwise(qtype):
    rng = np.random.default_rng(7)
    weights = (rng.standard_normal((12, 320)) * 0.05).astype(np.float32)
    weights[0, :32] = 0.0  # an all-zero block (scale 0)
    data = gguf.quants.quantize(weights, qtype)
    if qtype == Q.F16:
        data = data.view(np.uint8)  # raw bytes, as GGUFFile gives BF16 and may give F16
    matrix = load_matrix(qtype, data, weights.shape, "quantized")
    dequantized = matrix.dequantize()
    assert_bitwise_equal(dequantized, gguf_reference(qtype, data))
    # The round trip is within one 4-bit step (1/8 of the largest magnitude) of the original.
    assert np.abs(dequantized - weights).max() <= 0.13 * np.abs(weights).max()


def _models():
    return {
        "smollm2": default_model_path(),
        "gemma3": optional_model_path("gemma-3-270m-q4_k_m.gguf"),
        "qwen2": optional_model_path("qwen2.5-coder-0.5b-instruct.gguf"),
    }


REAL_TENSORS = [
    ("smollm2", "token_embd.weight"),  # Q8_0
    ("smollm2", "blk.0.ffn_up.weight"),  # Q4_1
    ("gemma3", "blk.0.attn_q.weight"),  # Q5_0
    ("gemma3", "blk.0.attn_output.weight"),  # Q4_K
    ("gemma3", "blk.0.ffn_down.weight"),  # Q6_K
    ("qwen2", "token_embd.weight"),  # Q5_0
    ("qwen2", "blk.0.ffn_down.weight"),  # Q6_K
    ("qwen2", "blk.0.attn_v.weight"),  # Q8_0
]


@pytest.mark.parametrize(("model", "tensor_name"), REAL_TENSORS)
def test_dequantize_real_tensors_bitwise(model, tensor_name):
    tensor = GGUFFile(_models()[model]).tensor(tensor_name)
    rows = min(tensor.shape[0], 2048)  # the embedding tables are large; a slab is enough
    data = tensor.data[:rows]
    matrix = load_matrix(tensor.type, data, (rows, tensor.shape[1]), tensor.name)
    assert_bitwise_equal(matrix.dequantize(), gguf_reference(tensor.type, data))


def test_every_real_matrix_type_is_supported():
    for path in _models().values():
        for tensor in GGUFFile(path).tensors.values():
            if len(tensor.shape) == 2:
                assert tensor.type in SUPPORTED_TYPES, (path.name, tensor.name, tensor.type.name)


# ---- float formats ----


def test_f32_stays_a_float32_matrix_without_copy():
    weights = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    matrix = load_matrix(Q.F32, weights, weights.shape)
    assert isinstance(matrix, FloatMatrix)
    assert np.shares_memory(matrix.weights, weights)
    x = np.arange(64, dtype=np.float32)
    # Our fixed summation order against float64: within float32 rounding of the summed terms.
    exact, terms = weights.astype(np.float64) @ x, np.abs(weights).astype(np.float64) @ np.abs(x)
    np.testing.assert_array_less(np.abs(matrix.matvec(x) - exact), 64 * 2.0**-24 * terms)
    rows = np.stack([matrix.matvec(x), matrix.matvec(-x)])  # each row as one-row products give it
    np.testing.assert_array_equal(matrix.matmul(np.stack([x, -x])), rows)
    assert_bitwise_equal(matrix.take_rows(np.array([4, 0])), weights[[4, 0]])


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16], ids=lambda t: t.name)
def test_half_formats_from_raw_bytes(qtype):
    raw = np.random.default_rng(2).integers(0, 256, (6, 2 * 48), dtype=np.uint8)
    raw.view(np.uint16)[(raw.view(np.uint16) & 0x7C00) == 0x7C00] = 0x3C00  # no inf/nan (F16)
    raw.view(np.uint16)[(raw.view(np.uint16) & 0x7F80) == 0x7F80] = 0x3F80  # no inf/nan (BF16)
    matrix = load_matrix(qtype, raw, (6, 48))
    assert_bitwise_equal(matrix.dequantize(), gguf_reference(qtype, raw))
    assert matrix.nbytes == 6 * 48 * 4


# ---- the rest of the public API ----


@pytest.mark.parametrize("keep_blocks", [False, True])
def test_take_rows_matches_dequantize(keep_blocks):
    data = random_quant_bytes(Q.Q4_K, 10, 512, seed=3)
    full = load_matrix(Q.Q4_K, data, (10, 512)).dequantize()
    matrix = load_matrix(Q.Q4_K, data, (10, 512), keep_blocks=keep_blocks)
    ids = np.array([3, 3, 9, 0, -1])
    assert_bitwise_equal(matrix.take_rows(ids), full[ids])  # (blocks: only those rows repacked)
    assert matrix.take_rows(np.array([], np.int64)).shape == (0, 512)
    with pytest.raises(IndexError):
        matrix.take_rows(np.array([10]))
    assert matrix.blocks_only == keep_blocks


def test_nbytes_counts_what_a_matrix_holds():
    # A format the fused step reads as blocks holds the file's bytes until a numpy path asks
    # for the int8 layout; the others are repacked at load.
    data = random_quant_bytes(Q.Q4_1, 48, 576)
    assert not load_matrix(Q.Q4_1, data, (48, 576)).blocks_only  # (repacked now by default)
    matrix = load_matrix(Q.Q4_1, data, (48, 576), keep_blocks=True)
    assert isinstance(matrix, GroupedMatrix) and matrix.blocks_only
    assert matrix.nbytes == data.nbytes == 48 * (576 // 32) * 20
    assert matrix.layout.q.shape == (48, 576) and not matrix.blocks_only
    assert matrix.nbytes == 48 * 576 + 2 * 48 * (576 // 32) * 4  # int8 values + scales + mins
    q6 = load_matrix(Q.Q6_K, random_quant_bytes(Q.Q6_K, 4, 256), (4, 256), keep_blocks=True)
    assert q6.nbytes == 4 * 210
    assert q6.layout.q.shape == (4, 256)
    assert q6.nbytes == 4 * 256 + 4 * (256 // 16) * 4  # no mins
    q5_1 = load_matrix(Q.Q5_1, random_quant_bytes(Q.Q5_1, 4, 256), (4, 256), keep_blocks=True)
    assert not q5_1.blocks_only and q5_1.nbytes == 4 * 256 + 2 * 4 * (256 // 32) * 4


def test_unsupported_type_names_the_type_and_tensor():
    with pytest.raises(GGUFError, match=r"blk\.0\.ffn_up\.weight: tensor type IQ2_XS is not supported"):
        load_matrix(Q.IQ2_XS, np.zeros((2, 66), np.uint8), (2, 256), "blk.0.ffn_up.weight")
    with pytest.raises(GGUFError, match="tensor type id 9999 is not supported"):
        load_matrix(9999, np.zeros((2, 2), np.uint8), (2, 2))


def test_bad_shapes_raise_gguf_errors():
    data = random_quant_bytes(Q.Q8_0, 4, 64)
    with pytest.raises(GGUFError, match="uint8"):
        load_matrix(Q.Q8_0, data, (4, 96), "w")  # bytes do not fit the shape
    with pytest.raises(GGUFError, match="whole Q8_0 blocks"):
        load_matrix(Q.Q8_0, data, (4, 48), "w")
    with pytest.raises(GGUFError, match="2-D"):
        load_matrix(Q.Q8_0, data.reshape(2, 2, -1), (2, 2, 64), "w")
    with pytest.raises(GGUFError, match="does not fit"):
        load_matrix(Q.F32, np.zeros((4, 8), np.float32), (4, 9), "w")
    with pytest.raises(GGUFError, match="does not fit"):
        load_matrix(Q.F16, np.zeros((4, 8), np.int16), (4, 8), "w")


def test_integer_type_id_is_accepted():
    data = random_quant_bytes(Q.Q5_0, 2, 64)
    assert load_matrix(int(Q.Q5_0), data, (2, 64)).qtype is Q.Q5_0
