"""The KV sidecar format and the disk tier of the slot pool."""

from __future__ import annotations

import logging
import struct

import numpy as np
import pytest

from inference.engine.kv_cache import KVCache, KVGeometry
from inference.kv_disk import SidecarStore, scan_sidecars
from inference.kv_sidecar import (
    COUNT_OFFSET,
    F16,
    Q8_0,
    SidecarError,
    SidecarHeader,
    append_sidecar,
    load_into,
    open_sidecar,
    write_sidecar,
)
from inference.slots import SlotPool

GEOMETRY = KVGeometry(n_layers=2, n_kv_heads=2, head_dim_k=16, head_dim_v=16)


def cache_with(tokens: list[int], seed: int = 0, geometry: KVGeometry = GEOMETRY) -> KVCache:
    cache = KVCache(geometry, 64)
    rng = np.random.default_rng(seed)
    n = len(tokens)
    for layer in range(geometry.n_layers):
        k = rng.standard_normal((n, geometry.n_kv_heads, geometry.head_dim_k)).astype(np.float32)
        v = rng.standard_normal((n, geometry.n_kv_heads, geometry.head_dim_v)).astype(np.float32)
        cache.write(layer, 0, k, v)
    cache.commit(tokens)
    return cache


def restored(path) -> KVCache:
    header, records = open_sidecar(path)
    cache = KVCache(GEOMETRY, 64)
    load_into(records, header, cache)
    return cache


def test_f16_round_trip_is_exact(tmp_path):
    source = cache_with(list(range(10, 30)))
    write_sidecar(tmp_path / "a.kv", source)
    back = restored(tmp_path / "a.kv")
    assert back.tokens == source.tokens and back.prefill_logits is None
    assert np.array_equal(back.k[:, :, :20], source.k[:, :, :20])
    assert np.array_equal(back.v[:, :, :20], source.v[:, :, :20])
    assert not list(tmp_path.glob(".*.tmp"))


def test_q8_0_round_trip_is_close(tmp_path):
    source = cache_with(list(range(8)))
    write_sidecar(tmp_path / "q.kv", source, Q8_0)
    header, records = open_sidecar(tmp_path / "q.kv")
    assert header.dtype == Q8_0 and header.row_bytes(32) == 34
    back = KVCache(GEOMETRY, 64)
    load_into(records, header, back)
    error = np.abs(back.k[:, :, :8] - source.k[:, :, :8]).max()
    assert 0 < error < 0.05


def test_a_torn_tail_keeps_the_valid_prefix(tmp_path):
    path = tmp_path / "t.kv"
    write_sidecar(path, cache_with(list(range(12))))
    header, _ = open_sidecar(path)
    cut = header.size + 7 * header.record_dtype.itemsize + 5  # inside record 8
    path.write_bytes(path.read_bytes()[:cut])
    assert restored(path).tokens == list(range(7))


def test_append_extends_in_place_and_writes_the_count_last(tmp_path):
    path = tmp_path / "g.kv"
    longer = cache_with(list(range(20)), seed=3)
    shorter = KVCache(GEOMETRY, 64)
    shorter.copy_rows_from(longer, 12)
    write_sidecar(path, shorter)
    assert append_sidecar(path, longer) == 20
    back = restored(path)
    assert back.tokens == list(range(20)) and np.array_equal(back.k[:, :, :20], longer.k[:, :, :20])
    # an append interrupted before the count was rewritten leaves the old, valid file
    data = bytearray(path.read_bytes())
    data[COUNT_OFFSET : COUNT_OFFSET + 4] = struct.pack("<I", 12)
    path.write_bytes(bytes(data))
    assert restored(path).tokens == list(range(12))


def test_a_corrupted_header_is_rejected(tmp_path):
    path = tmp_path / "c.kv"
    write_sidecar(path, cache_with([1, 2, 3]))
    data = bytearray(path.read_bytes())
    data[COUNT_OFFSET + 12] ^= 0xFF  # the first layer's kv-head count
    path.write_bytes(bytes(data))
    with pytest.raises(SidecarError, match="checksum"):
        open_sidecar(path)


def test_store_ignores_corrupt_and_foreign_files_with_a_log_line(tmp_path, caplog):
    write_sidecar(tmp_path / "good.kv", cache_with([1, 2, 3]))
    write_sidecar(tmp_path / "foreign.kv", cache_with([1, 2], geometry=KVGeometry(1, 1, 32, 32)))
    (tmp_path / "junk.kv").write_bytes(b"LMSKV001" + b"\x07" * 40)
    (tmp_path / ".half.kv.tmp").write_bytes(b"LMSKV001")
    with caplog.at_level(logging.INFO, logger="lmserve.kv_disk"):
        store = SidecarStore(tmp_path, 4, GEOMETRY)
    assert [s.path.name for s in store.files] == ["good.kv"]
    assert "ignoring KV sidecar junk.kv: corrupted header" in caplog.text
    assert "ignoring KV sidecar foreign.kv: geometry" in caplog.text
    assert {e["name"] for e in scan_sidecars(tmp_path)} == {"good.kv", "foreign.kv", "junk.kv"}


def test_store_dedups_contained_slots_extends_prefixes_and_reuses_lru(tmp_path):
    store = SidecarStore(tmp_path, 2, GEOMETRY)
    long = cache_with(list(range(10)))
    first = store.spill(long)
    assert store.spill(cache_with(list(range(6)))) is None  # contained in the file
    assert store.spill(cache_with(list(range(14)))) == first  # continues it: extended in place
    assert store.files[0].tokens == list(range(14))
    second = store.spill(cache_with([50, 51, 52]))
    third = store.spill(cache_with([60, 61]))
    assert not first.exists() and second.exists() and third.exists()
    assert len(list(tmp_path.glob("*.kv"))) == 2
    assert [s.path for s in SidecarStore(tmp_path, 2, GEOMETRY).files] != []


def test_pool_spills_a_destroyed_slot_and_restores_it_with_no_reprefill(tmp_path):
    store = SidecarStore(tmp_path, 4, GEOMETRY)
    slots = SlotPool(lambda: KVCache(GEOMETRY, 64), 1, disk=store)
    a = slots.acquire(list(range(1, 11)))
    a.copy_rows_from(cache_with(list(range(1, 16)), seed=9), 15)
    original_k = a.k[:, :, :15].copy()
    b = slots.acquire([90] * 12)  # unrelated: slot a is destroyed, so it spills first
    assert b is a and len(store.files) == 1
    b.truncate(0)
    b.copy_rows_from(cache_with([90] * 12, seed=4), 12)
    back = slots.acquire(list(range(1, 16)) + [77])
    assert back.tokens == list(range(1, 16)) and np.array_equal(back.k[:, :, :15], original_k)
    assert len(store.files) == 2  # the unrelated slot spilled in turn
    assert SidecarHeader(GEOMETRY, F16, 0).size == 8 + 12 + 24 + 4
