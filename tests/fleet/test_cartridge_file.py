"""The cartridge file format: round trip, atomic write, clear errors, model checks."""

from __future__ import annotations

import numpy as np
import pytest

from fleet.cartridges.file import Cartridge, CartridgeFormatError, load_cartridge, save_cartridge
from fleet.cartridges.init import initial_cartridge
from inference.engine.engine import Engine
from inference.engine.kv_cache import KVGeometry
from inference.engine.prefix import KVPrefix, PrefixMismatchError
from tests.fixtures.synthetic_gguf import synthetic_path


def _random(rows: int = 5, frozen: int = 1) -> Cartridge:
    rng = np.random.default_rng(3)
    k = rng.standard_normal((2, 3, rows, 8)).astype(np.float32)
    v = rng.standard_normal((2, 3, rows, 4)).astype(np.float32)
    return Cartridge(k, v, bytes(range(16)), frozen, {"steps": 7, "lr": 0.01})


@pytest.mark.parametrize("frozen", [0, 1, 2])
def test_round_trip_keeps_every_value_and_the_metadata(tmp_path, frozen):
    original = _random(frozen=frozen)
    loaded = load_cartridge(save_cartridge(tmp_path / "c.safetensors", original))
    assert np.array_equal(loaded.k, original.k) and np.array_equal(loaded.v, original.v)
    assert (loaded.fingerprint, loaded.frozen_rows, loaded.training) == (
        original.fingerprint,
        frozen,
        original.training,
    )
    assert loaded.geometry == KVGeometry(2, 3, 8, 4) and loaded.rows == 5
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_layout_on_disk_is_rows_heads_dim_with_the_sink_apart(tmp_path):
    from safetensors.numpy import load_file

    tensors = load_file(str(save_cartridge(tmp_path / "c.safetensors", _random(rows=5, frozen=1))))
    assert tensors["layers.0.k_sink"].shape == (1, 3, 8) and tensors["layers.0.k"].shape == (4, 3, 8)
    assert tensors["layers.1.v"].shape == (4, 3, 4)


def test_unreadable_files_are_named(tmp_path):
    with pytest.raises(CartridgeFormatError, match="no such cartridge"):
        load_cartridge(tmp_path / "missing.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file at all")
    with pytest.raises(CartridgeFormatError, match="junk.safetensors"):
        load_cartridge(junk)


def test_rows_that_are_not_finite_are_refused_naming_the_tensor(tmp_path):
    path = save_cartridge(tmp_path / "c.safetensors", _random(rows=30, frozen=1))
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")  # the first tensor's bytes
    data[start : start + 400] = b"\xff" * 400  # 100 float32 NaNs, as a stray write leaves them
    path.write_bytes(bytes(data))
    with pytest.raises(
        CartridgeFormatError,
        match=r"c.safetensors: 100 non-finite values \(NaN or infinity\) in layers\.0\.k$",
    ):
        load_cartridge(path)
    sink = _random(frozen=1)
    sink.v[1, 2, 0, 3] = np.inf  # layer 1's frozen row 0
    with pytest.raises(
        CartridgeFormatError, match=r"1 non-finite value \(NaN or infinity\) in layers\.1\.v_sink"
    ):
        load_cartridge(save_cartridge(tmp_path / "inf.safetensors", sink))


def test_model_mismatch_is_refused_with_what_differs():
    cart = _random()
    with pytest.raises(PrefixMismatchError, match="geometry"):
        cart.check_model(KVGeometry(2, 3, 16, 4), cart.fingerprint)
    with pytest.raises(PrefixMismatchError, match="fingerprint"):
        cart.check_model(cart.geometry, bytes(16))
    cart.check_model(cart.geometry, cart.fingerprint)


def test_concat_is_along_rows_and_checks_geometry():
    a, b = _random(rows=2).prefix(), _random(rows=3).prefix()
    both = KVPrefix.concat([a, b])
    assert both.rows == 5 and np.array_equal(both.k[:, :, 2:], b.k)
    with pytest.raises(PrefixMismatchError):
        KVPrefix.concat([a, KVPrefix(np.zeros((1, 3, 2, 8), np.float32), np.zeros((1, 3, 2, 4), np.float32))])


def test_initial_cartridge_holds_the_prefill_rows(synthetic_dir):
    engine = Engine.load(synthetic_path("llama", synthetic_dir))
    tokens = list(range(5, 17))
    cart = initial_cartridge(engine, tokens)
    cache = engine.new_cache(len(tokens))
    engine.prefill(cache, tokens)
    assert cart.rows == len(tokens) and cart.fingerprint == engine.fingerprint
    assert np.array_equal(cart.k.astype(np.float16), cache.k[:, :, : len(tokens)])
    cart.check_model(engine.config.kv_geometry, engine.fingerprint)
