"""KV cache bookkeeping: positions, append, truncate, prefix match, row copy."""

import numpy as np
import pytest

from inference.engine.kv_cache import ContextFullError, KVCache, KVGeometry

GEOMETRY = KVGeometry(n_layers=2, n_kv_heads=2, head_dim_k=4, head_dim_v=4)


def filled(tokens, seed=0):
    cache = KVCache(GEOMETRY, 16)
    rng = np.random.default_rng(seed)
    for layer in range(GEOMETRY.n_layers):
        rows = rng.standard_normal((len(tokens), 2, 4)).astype(np.float32)  # (n, kvh, hd)
        cache.write(layer, 0, rows, rows * 2)
    cache.commit(tokens)
    return cache


def test_write_stores_rows_by_position_at_f16_precision():
    cache = KVCache(GEOMETRY, 8)
    k = np.full((3, 2, 4), 1 / 3, np.float32)  # (n, kvh, hd)
    cache.write(1, 2, k, -k)
    cache.commit([5, 6, 7, 8, 9])
    assert cache.k[1, :, 2:5].tolist() == np.full((2, 3, 4), np.float16(1 / 3), np.float32).tolist()
    assert cache.n_tokens == 5 and cache.v[1, 0, 2, 0] == -np.float32(np.float16(1 / 3))


def test_commit_past_the_context_raises():
    cache = KVCache(GEOMETRY, 4)
    cache.commit([1, 2, 3])
    with pytest.raises(ContextFullError, match="n_ctx 4"):
        cache.commit([4, 5])


def test_common_prefix_and_truncate():
    cache = filled([1, 2, 3, 4])
    assert cache.common_prefix([1, 2, 9]) == 2
    assert cache.common_prefix([1, 2, 3, 4, 5]) == 4
    cache.truncate(2)
    assert cache.tokens == [1, 2] and cache.n_tokens == 2


def test_copy_rows_keeps_positions_and_leaves_the_donor_intact():
    donor = filled([1, 2, 3, 4], seed=1)
    copy = KVCache(GEOMETRY, 16)
    copy.copy_rows_from(donor, 3)
    assert copy.tokens == [1, 2, 3]
    assert np.array_equal(copy.k[:, :, :3], donor.k[:, :, :3])
    assert np.array_equal(copy.v[:, :, :3], donor.v[:, :, :3])
    assert donor.tokens == [1, 2, 3, 4]


def test_copy_rows_refuses_a_foreign_geometry():
    other = KVCache(KVGeometry(2, 1, 4, 4), 16)
    with pytest.raises(ValueError, match="geometr"):
        KVCache(GEOMETRY, 16).copy_rows_from(other, 0)


def _prefix(rows: int, seed: int = 5):
    from inference.engine.prefix import KVPrefix

    rng = np.random.default_rng(seed)
    k = rng.standard_normal((2, 2, rows, 4)).astype(np.float32)  # (L, kvh, rows, hd)
    return KVPrefix(k, -k)


def test_a_prefix_takes_the_first_rows_rounded_to_f16_and_tokens_follow_it():
    cache = filled([1, 2, 3])
    prefix = _prefix(3)
    cache.install_prefix(prefix, "cart")
    assert (cache.prefix_rows, cache.prefix_key, cache.tokens) == (3, "cart", [])
    assert np.array_equal(cache.k[:, :, :3], prefix.k.astype(np.float16))
    assert cache.n_tokens == 0 and cache.n_positions == 3
    cache.commit([7, 8])
    assert cache.n_tokens == 2 and cache.n_positions == 5 and cache.common_prefix([7, 9]) == 1


def test_truncation_never_cuts_into_the_prefix_and_room_counts_it():
    cache = KVCache(GEOMETRY, 8)
    cache.install_prefix(_prefix(5), "p")
    cache.commit([1, 2])
    cache.truncate(0)
    assert cache.prefix_rows == 5 and cache.n_positions == 5
    cache.commit([1, 2, 3])
    with pytest.raises(ContextFullError, match="after 5 prefix rows"):
        cache.check_room(1)
    with pytest.raises(ContextFullError, match="no room"):
        KVCache(GEOMETRY, 4).install_prefix(_prefix(4))


def test_copy_rows_carries_the_prefix_and_its_key():
    donor = KVCache(GEOMETRY, 16)
    donor.install_prefix(_prefix(2), "fleet:a")
    donor.write(0, 2, np.ones((3, 2, 4), np.float32), np.ones((3, 2, 4), np.float32))
    donor.commit([4, 5, 6])
    copy = filled([9])
    copy.copy_rows_from(donor, 2)
    assert (copy.prefix_rows, copy.prefix_key, copy.tokens) == (2, "fleet:a", [4, 5])
    assert np.array_equal(copy.k[:, :, :4], donor.k[:, :, :4])
    copy.install_prefix(None)
    assert (copy.prefix_rows, copy.prefix_key, copy.n_positions) == (0, "", 0)
