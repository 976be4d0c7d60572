"""The KV sidecar format and the disk tier of the slot pool."""

from __future__ import annotations

import errno
import logging
import resource
import signal
import struct
import uuid
from contextlib import contextmanager

import numpy as np
import pytest

from inference.engine.kv_cache import KVCache, KVGeometry
from inference.kv.disk import OWN_TEMPORARY, SidecarStore, scan_sidecars
from inference.kv.sidecar import (
    COUNT_OFFSET,
    F16,
    HEADER_PREFIX,
    Q8_0,
    SidecarError,
    SidecarHeader,
    append_sidecar,
    load_into,
    open_sidecar,
    temporary_path,
    write_sidecar,
)
from inference.kv.slots import SlotPool

GEOMETRY = KVGeometry(n_layers=2, n_kv_heads=2, head_dim_k=16, head_dim_v=16)
MODEL = bytes(range(16))  # the fingerprint of the model these caches belong to


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
    write_sidecar(tmp_path / "a.kv", source, MODEL)
    back = restored(tmp_path / "a.kv")
    assert back.tokens == source.tokens and back.prefill_logits is None
    assert np.array_equal(back.k[:, :, :20], source.k[:, :, :20])
    assert np.array_equal(back.v[:, :, :20], source.v[:, :, :20])
    assert not list(tmp_path.glob(".*.tmp"))


def test_q8_0_round_trip_is_close(tmp_path):
    source = cache_with(list(range(8)))
    write_sidecar(tmp_path / "q.kv", source, MODEL, Q8_0)
    header, records = open_sidecar(tmp_path / "q.kv")
    assert header.dtype == Q8_0 and header.row_bytes(32) == 34
    back = KVCache(GEOMETRY, 64)
    load_into(records, header, back)
    error = np.abs(back.k[:, :, :8] - source.k[:, :, :8]).max()
    assert 0 < error < 0.05


def test_a_torn_tail_keeps_the_valid_prefix(tmp_path):
    path = tmp_path / "t.kv"
    write_sidecar(path, cache_with(list(range(12))), MODEL)
    header, _ = open_sidecar(path)
    cut = header.size + 7 * header.record_dtype.itemsize + 5  # inside record 8
    path.write_bytes(path.read_bytes()[:cut])
    assert restored(path).tokens == list(range(7))


def test_append_extends_in_place_and_writes_the_count_last(tmp_path):
    path = tmp_path / "g.kv"
    longer = cache_with(list(range(20)), seed=3)
    shorter = KVCache(GEOMETRY, 64)
    shorter.copy_rows_from(longer, 12)
    write_sidecar(path, shorter, MODEL)
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
    write_sidecar(path, cache_with([1, 2, 3]), MODEL)
    data = bytearray(path.read_bytes())
    data[HEADER_PREFIX] ^= 0xFF  # the first layer's kv-head count
    path.write_bytes(bytes(data))
    with pytest.raises(SidecarError, match="checksum"):
        open_sidecar(path)


def test_store_ignores_corrupt_and_foreign_files_with_a_log_line(tmp_path, caplog):
    write_sidecar(tmp_path / "good.kv", cache_with([1, 2, 3]), MODEL)
    write_sidecar(tmp_path / "foreign.kv", cache_with([1, 2], geometry=KVGeometry(1, 1, 32, 32)), MODEL)
    (tmp_path / "junk.kv").write_bytes(b"LMSKV003" + b"\x07" * 40)
    (tmp_path / "old.kv").write_bytes(b"LMSKV001" + b"\x02" * 40)
    (tmp_path / ".half.kv.tmp").write_bytes(b"LMSKV003")
    with caplog.at_level(logging.INFO, logger="lmserve.kv_disk"):
        store = SidecarStore(tmp_path, 4, GEOMETRY, MODEL)
    assert [s.path.name for s in store.files] == ["good.kv"]
    assert "ignoring KV sidecar junk.kv: corrupted header" in caplog.text
    assert "ignoring KV sidecar foreign.kv: geometry" in caplog.text
    assert "ignoring KV sidecar old.kv: an older sidecar format (LMSKV001)" in caplog.text
    assert {e["name"] for e in scan_sidecars(tmp_path)} == {"good.kv", "foreign.kv", "junk.kv", "old.kv"}


def test_store_dedups_contained_slots_extends_prefixes_and_reuses_lru(tmp_path):
    store = SidecarStore(tmp_path, 2, GEOMETRY, MODEL)
    long = cache_with(list(range(10)))
    first = store.spill(long)
    assert store.spill(cache_with(list(range(6)))) is None  # contained in the file
    assert store.spill(cache_with(list(range(14)))) == first  # continues it: extended in place
    assert store.files[0].tokens == list(range(14))
    second = store.spill(cache_with([50, 51, 52]))
    third = store.spill(cache_with([60, 61]))
    assert not first.exists() and second.exists() and third.exists()
    assert len(list(tmp_path.glob("*.kv"))) == 2
    assert [s.path for s in SidecarStore(tmp_path, 2, GEOMETRY, MODEL).files] != []


def test_pool_spills_a_destroyed_slot_and_restores_it_with_no_reprefill(tmp_path):
    store = SidecarStore(tmp_path, 4, GEOMETRY, MODEL)
    slots = SlotPool(lambda: KVCache(GEOMETRY, 64), 1, disk=store)
    a = slots.acquire(list(range(1, 11)))
    a.copy_rows_from(cache_with(list(range(1, 16)), seed=9), 15)
    original_k = a.k[:, :, :15].copy()
    slots.release()
    b = slots.acquire([90] * 12)  # unrelated: slot a is destroyed, so it spills first
    assert b is a and len(store.files) == 1
    b.truncate(0)
    b.copy_rows_from(cache_with([90] * 12, seed=4), 12)
    slots.release()
    back = slots.acquire(list(range(1, 16)) + [77])
    assert back.tokens == list(range(1, 16)) and np.array_equal(back.k[:, :, :15], original_k)
    assert len(store.files) == 2  # the unrelated slot spilled in turn
    assert SidecarHeader(GEOMETRY, F16, 0, MODEL).size == 8 + 4 + 16 + 16 + 24 + 4


def test_overwritten_rows_fail_their_checksum_and_the_file_is_dropped(tmp_path, caplog):
    store = SidecarStore(tmp_path, 4, GEOMETRY, MODEL)
    path = store.spill(cache_with(list(range(1, 21)), seed=5))
    header, _ = open_sidecar(path)
    data = bytearray(path.read_bytes())
    start = header.size + 9 * header.record_dtype.itemsize + 4 + 10  # inside record 9's K row
    data[start : start + 16] = bytes(16)  # zeroed, as a stray write would leave it
    path.write_bytes(bytes(data))
    target = cache_with([7], seed=1)
    (stored,) = store.files
    with caplog.at_level(logging.WARNING, logger="lmserve.kv_disk"):
        assert store.restore(stored, target) is False
    assert f"cannot restore KV sidecar {path.name}: record 9 of 20 fails its checksum" in caplog.text
    assert target.n_tokens == 0 and store.files == [] and not path.exists()


def test_sidecars_of_another_model_of_the_same_shape_are_ignored(tmp_path, caplog):
    """Two synthetic GGUFs with identical metadata and shapes, different weights (a fine-tune)."""
    from inference.engine.engine import Engine
    from tests.fixtures.synthetic_gguf import write_synthetic

    base = Engine.load(write_synthetic("llama", tmp_path / "base.gguf"))
    tuned = Engine.load(write_synthetic("llama", tmp_path / "tuned.gguf", seed=7))
    assert base.file.metadata.keys() == tuned.file.metadata.keys()
    assert base.config.kv_geometry == tuned.config.kv_geometry
    assert base.fingerprint != tuned.fingerprint
    assert Engine.load(tmp_path / "base.gguf").fingerprint == base.fingerprint  # stable across loads

    geometry, disk = base.config.kv_geometry, tmp_path / "kv"
    cache = KVCache(geometry, 64)
    base.prefill(cache, [1, 2, 3, 4, 5])
    SidecarStore(disk, 4, geometry, base.fingerprint).spill(cache)
    with caplog.at_level(logging.INFO, logger="lmserve.kv_disk"):
        assert SidecarStore(disk, 4, geometry, tuned.fingerprint).files == []
    assert caplog.text.count("written by another model") == 1
    assert len(SidecarStore(disk, 4, geometry, base.fingerprint).files) == 1


def test_a_full_disk_tier_never_evicts_the_file_being_restored(tmp_path):
    """Restoring into a slot spills that slot first; with the tier full, the spill's eviction
    used to pick the very file about to be restored (the least recently used one), and the
    restore then failed on a vanished file and crashed the request."""
    store = SidecarStore(tmp_path, 1, GEOMETRY, MODEL)
    slots = SlotPool(lambda: KVCache(GEOMETRY, 64), 1, disk=store)
    a = slots.acquire(list(range(1, 11)))
    a.copy_rows_from(cache_with(list(range(1, 16)), seed=9), 15)
    original_k = a.k[:, :, :15].copy()
    slots.release()
    b = slots.acquire([90] * 12)  # unrelated: slot a is spilled, filling the one-file tier
    b.truncate(0)
    b.copy_rows_from(cache_with([90] * 12, seed=4), 12)
    slots.release()
    back = slots.acquire(list(range(1, 16)) + [77])
    assert back.tokens == list(range(1, 16)) and np.array_equal(back.k[:, :, :15], original_k)
    assert slots.stats.disk_hits == 1


def behind_prefix(tokens: list[int], key: str, rows: int = 3, seed: int = 7) -> KVCache:
    from inference.engine.prefix import KVPrefix

    rng = np.random.default_rng(seed)
    shape = (GEOMETRY.n_layers, GEOMETRY.n_kv_heads, rows, GEOMETRY.head_dim_k)
    k, v = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
    prefix = KVPrefix(k, v)
    cache = KVCache(GEOMETRY, 64)
    cache.install_prefix(prefix, key)
    for layer in range(GEOMETRY.n_layers):
        k = rng.standard_normal((len(tokens), GEOMETRY.n_kv_heads, GEOMETRY.head_dim_k)).astype(np.float32)
        cache.write(layer, rows, k, -k)
    cache.commit(tokens)
    return cache


def test_a_sidecar_records_its_prefix_and_a_restore_brings_it_back(tmp_path):
    source = behind_prefix([5, 6, 7, 8], "docs:alpha,beta")
    write_sidecar(tmp_path / "p.kv", source, MODEL)
    header, _ = open_sidecar(tmp_path / "p.kv")
    assert (header.count, header.prefix_rows, header.prefix_key) == (7, 3, "docs:alpha,beta")
    back = KVCache(GEOMETRY, 64)
    back.commit([1, 1])  # whatever it held before is replaced, prefix included
    header, records = open_sidecar(tmp_path / "p.kv")
    load_into(records, header, back)
    assert (back.prefix_rows, back.prefix_key, back.tokens) == (3, "docs:alpha,beta", [5, 6, 7, 8])
    assert np.array_equal(back.k[:, :, :7], source.k[:, :, :7])
    assert np.array_equal(back.v[:, :, :7], source.v[:, :, :7])
    entry = scan_sidecars(tmp_path)[0]
    assert (entry["tokens"], entry["prefix_rows"], entry["prefix_key"]) == (4, 3, "docs:alpha,beta")
    # Appending a continuation behind the same prefix keeps the prefix rows where they were.
    source.write(0, 7, np.ones((1, 2, 16), np.float32), np.ones((1, 2, 16), np.float32))
    source.commit([9])
    assert append_sidecar(tmp_path / "p.kv", source) == 8
    assert restored(tmp_path / "p.kv").tokens == [5, 6, 7, 8, 9]


def test_the_disk_tier_matches_a_prompt_only_behind_the_same_prefix_key(tmp_path):
    store = SidecarStore(tmp_path, 4, GEOMETRY, MODEL)
    store.spill(behind_prefix([1, 2, 3, 4], "alpha"))
    store.spill(cache_with([1, 2, 3, 4]))  # the same tokens with no prefix: another conversation
    assert len(store.files) == 2
    stored, shared = store.best_match([1, 2, 3, 4, 5], "alpha")
    assert shared == 4 and stored.prefix_key == "alpha"
    assert store.best_match([1, 2, 3], "beta") == (None, 0)
    again = SidecarStore(tmp_path, 4, GEOMETRY, MODEL)  # found again after a restart
    assert sorted(s.prefix_key for s in again.files) == ["", "alpha"]


# -- rows that are not finite, temporaries --------------------------------------------------------
def with_non_finite(tokens: list[int], record: int, layer: int, value: float) -> KVCache:
    """A cache whose row ``record`` holds ``value`` (NaN, inf) in one key of ``layer``."""
    cache = cache_with(tokens, seed=3)
    k = cache.k[layer, :, record : record + 1].transpose(1, 0, 2).astype(np.float32)  # (1, kvh, hd)
    v = cache.v[layer, :, record : record + 1].transpose(1, 0, 2).astype(np.float32)
    k[0, 1, 5] = value
    cache.write(layer, record, k, v)
    return cache


def test_rows_that_are_not_finite_behind_valid_checksums_are_dropped_like_damaged_rows(tmp_path, caplog):
    """Checksums hold over rows written so (a cache behind a NaN cartridge, a forged file): the
    restore refuses them as it refuses damaged rows, and the request prefills instead."""
    store = SidecarStore(tmp_path, 4, GEOMETRY, MODEL)
    slots = SlotPool(lambda: KVCache(GEOMETRY, 64), 1, disk=store)
    path = store.spill(with_non_finite(list(range(1, 21)), record=6, layer=1, value=np.nan))
    with caplog.at_level(logging.WARNING, logger="lmserve.kv_disk"):
        cache = slots.acquire(list(range(1, 21)) + [99])
    refused = f"cannot restore KV sidecar {path.name}: record 6 of 20 holds a NaN or infinite value (layer 1)"
    assert refused in caplog.text
    assert cache.n_tokens == 0 and slots.stats.disk_hits == 0 and slots.stats.misses == 1
    assert store.files == [] and not path.exists()
    q8 = tmp_path / "q8.kv"  # q8_0: an infinity makes its block's f16 scale infinite
    with np.errstate(invalid="ignore"):  # the infinity's own block quantizes to garbage codes
        write_sidecar(q8, with_non_finite(list(range(1, 9)), record=2, layer=0, value=np.inf), MODEL, Q8_0)
    header, records = open_sidecar(q8)
    target = KVCache(GEOMETRY, 64)
    with pytest.raises(SidecarError, match=r"record 2 of 8 holds a NaN or infinite value \(layer 0\)"):
        load_into(records, header, target)
    assert target.n_tokens == 0 and not target.k.any()  # the cache untouched


def test_stale_temporaries_of_an_interrupted_spill_are_removed_at_start_up_and_nothing_else(tmp_path, caplog):
    """A kill -9 mid-spill leaves ``.<uuid hex>.kv.tmp``: nothing renames it, and it sat outside
    --kv-disk-slots' count for ever. The next start-up removes it; other files stay."""
    store = SidecarStore(tmp_path, 2, GEOMETRY, MODEL)
    store.spill(cache_with(list(range(1, 11))))
    store.spill(cache_with(list(range(20, 30))))
    stale = [tmp_path / f".{uuid.uuid4().hex}.kv.tmp" for _ in range(2)]
    for path in stale:
        path.write_bytes(b"LMSKV003" + bytes(1000))  # half a sidecar
    others = ["notes.kv.tmp", ".half.kv.tmp", f".{'A' * 32}.kv.tmp", f"{uuid.uuid4().hex}.kv.tmp", "x.tmp"]
    for name in others:
        (tmp_path / name).write_bytes(b"not ours")
    assert OWN_TEMPORARY.fullmatch(temporary_path(store.files[0].path).name)  # the names spills write
    with caplog.at_level(logging.WARNING, logger="lmserve.kv_disk"):
        again = SidecarStore(tmp_path, 2, GEOMETRY, MODEL)
    names = ", ".join(sorted(p.name for p in stale))
    line = f"removed 2 stale KV sidecar temporaries (2016 bytes) left by an interrupted spill in {tmp_path}"
    assert f"{line}: {names}" in caplog.text
    assert not any(path.exists() for path in stale) and all((tmp_path / name).exists() for name in others)
    assert len(again.files) == 2  # the budget: two files, no temporary beside them
    assert len([p for p in tmp_path.iterdir() if p.suffix == ".kv" or OWN_TEMPORARY.fullmatch(p.name)]) == 2


@contextmanager
def file_size_limit(limit: int):
    """Writes past ``limit`` bytes fail with EFBIG, as a full disk fails them with ENOSPC."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an error, not a killed process
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def test_a_spill_that_fails_mid_write_leaves_no_temporary(tmp_path, caplog):
    store = SidecarStore(tmp_path, 4, GEOMETRY, MODEL)
    slots = SlotPool(lambda: KVCache(GEOMETRY, 64), 1, disk=store)
    a = slots.acquire(list(range(1, 41)))
    a.copy_rows_from(cache_with(list(range(1, 41)), seed=9), 40)
    slots.release()
    with pytest.raises(OSError) as failed, file_size_limit(4096):  # 40 records take 10 KiB
        write_sidecar(tmp_path / "direct.kv", a, MODEL)
    assert failed.value.errno == errno.EFBIG
    with file_size_limit(4096), caplog.at_level(logging.ERROR, logger="lmserve.slots"):
        b = slots.acquire([90] * 12)  # unrelated: the slot spills first, and the spill fails
    assert b is a and store.files == [] and "could not spill a KV slot" in caplog.text
    assert list(tmp_path.iterdir()) == []  # neither write left its temporary behind
