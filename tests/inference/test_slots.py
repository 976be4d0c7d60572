"""SlotPool: which resident KV cache a prompt warm-starts from."""

from inference.engine.kv_cache import KVCache, KVGeometry
from inference.slots import SlotPool

GEOMETRY = KVGeometry(n_layers=1, n_kv_heads=1, head_dim_k=2, head_dim_v=2)


def filled(cache: KVCache, tokens: list[int]) -> KVCache:
    cache.commit(tokens)
    return cache


def pool(n: int) -> SlotPool:
    return SlotPool(lambda: KVCache(GEOMETRY, 64), n)


def test_single_slot_is_always_reused():
    slots = pool(1)
    first = filled(slots.acquire([1, 2, 3]), [1, 2, 3])
    assert slots.acquire([9, 9]) is first


def test_continuation_adopts_the_slot_holding_its_history():
    slots = pool(2)
    a = filled(slots.acquire([1, 2, 3]), [1, 2, 3, 4])
    b = filled(slots.acquire([7, 8, 9]), [7, 8, 9])
    assert a is not b
    assert slots.acquire([1, 2, 3, 4, 5, 6]) is a
    assert slots.acquire([7, 8, 9, 10]) is b


def test_shared_prefix_is_copied_and_the_donor_kept():
    slots = pool(2)
    donor = filled(slots.acquire([1, 2, 3, 4, 5]), [1, 2, 3, 4, 5])
    donor.k[:, :, :5] = 1.0
    other = slots.acquire([1, 2, 3, 9, 9])  # shares 3 tokens, diverges inside the donor
    assert other is not donor
    assert other.tokens == [1, 2, 3] and donor.tokens == [1, 2, 3, 4, 5]
    assert (other.k[:, :, :3] == 1.0).all()


def test_unrelated_prompt_takes_the_least_recently_used_slot():
    slots = pool(2)
    a = filled(slots.acquire([1] * 20), [1] * 20)
    b = filled(slots.acquire([2] * 20), [2] * 20)
    assert slots.acquire([1] * 20 + [3]) is a  # touch a: b is now the LRU
    assert slots.acquire([5] * 30) is b
