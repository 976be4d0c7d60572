"""SlotPool: which resident KV cache a prompt warm-starts from."""

from inference.engine.kv_cache import KVCache, KVGeometry
from inference.kv.slots import SlotPool

GEOMETRY = KVGeometry(n_layers=1, n_kv_heads=1, head_dim_k=2, head_dim_v=2)


def filled(cache: KVCache, tokens: list[int]) -> KVCache:
    cache.commit(tokens)
    return cache


def served(slots: SlotPool, prompt: list[int]) -> KVCache:
    """The cache a request for ``prompt`` is served in, released again as the worker does after
    each job (a busy slot is never chosen for another stream)."""
    cache = slots.acquire(prompt)
    slots.release()
    return cache


def pool(n: int) -> SlotPool:
    return SlotPool(lambda: KVCache(GEOMETRY, 64), n)


def test_single_slot_is_always_reused():
    slots = pool(1)
    first = filled(served(slots, [1, 2, 3]), [1, 2, 3])
    assert served(slots, [9, 9]) is first


def test_continuation_adopts_the_slot_holding_its_history():
    slots = pool(2)
    a = filled(served(slots, [1, 2, 3]), [1, 2, 3, 4])
    b = filled(served(slots, [7, 8, 9]), [7, 8, 9])
    assert a is not b
    assert served(slots, [1, 2, 3, 4, 5, 6]) is a
    assert served(slots, [7, 8, 9, 10]) is b


def test_shared_prefix_is_copied_and_the_donor_kept():
    slots = pool(2)
    donor = filled(served(slots, [1, 2, 3, 4, 5]), [1, 2, 3, 4, 5])
    donor.k[:, :, :5] = 1.0
    other = served(slots, [1, 2, 3, 9, 9])  # shares 3 tokens, diverges inside the donor
    assert other is not donor
    assert other.tokens == [1, 2, 3] and donor.tokens == [1, 2, 3, 4, 5]
    assert (other.k[:, :, :3] == 1.0).all()


def test_unrelated_prompt_takes_the_least_recently_used_slot():
    slots = pool(2)
    a = filled(served(slots, [1] * 20), [1] * 20)
    b = filled(served(slots, [2] * 20), [2] * 20)
    assert served(slots, [1] * 20 + [3]) is a  # touch a: b is now the LRU
    assert served(slots, [5] * 30) is b


def test_donor_that_is_least_recently_used_is_still_kept():
    slots = pool(3)
    donor = filled(served(slots, [1, 2, 3, 4, 5]), [1, 2, 3, 4, 5])
    recent = filled(served(slots, [8] * 10), [8] * 10)
    other = served(slots, [1, 2, 3, 9, 9])
    assert other is not donor and other is not recent
    assert donor.tokens == [1, 2, 3, 4, 5] and recent.tokens == [8] * 10


def test_continuation_diverging_inside_the_reply_adopts_the_slot():
    slots = pool(2)
    a = filled(served(slots, [1, 2, 3]), [1, 2, 3, 40, 41, 42])  # prompt + generated reply
    # the client re-tokenized the reply differently after its first token
    assert served(slots, [1, 2, 3, 40, 50, 51, 7]) is a


def test_repeating_a_request_adopts_its_slot():
    slots = pool(2)
    a = filled(served(slots, [1, 2, 3]), [1, 2, 3, 40, 41])
    filled(served(slots, [6, 6, 6]), [6, 6, 6])
    assert served(slots, [1, 2, 3]) is a


def test_a_share_below_the_similarity_gate_does_not_count():
    slots = pool(2)
    a = filled(served(slots, [1] + [2] * 30), [1] + [2] * 30)
    b = filled(served(slots, [5] * 30), [5] * 30)
    filled(served(slots, [5] * 31), [5] * 31)  # touch b
    chosen = served(slots, [1] + [9] * 29)  # shares one token of 30: under 10%
    assert chosen is a and chosen is not b


def test_evicting_a_busy_slot_waits_for_its_generation_to_end():
    slots = pool(2)
    filled(slots.acquire([1, 2, 3]), [1, 2, 3])
    assert slots.evict(0) == "pending" and slots.status()[0]["evict_pending"]
    assert slots.status()[0]["tokens"] == 3
    slots.release()
    assert slots.status()[0] == {
        "index": 0,
        "tokens": 0,
        "prefix_key": "",
        "prefix_rows": 0,
        "last_used": slots.slots[0].used_at,
        "bytes": 0,
        "busy": False,
        "evict_pending": False,
    }
    filled(slots.acquire([4, 5]), [4, 5])
    slots.release()
    assert slots.evict(0) == "evicted" and slots.evict(1) == "evicted"
    assert [s["tokens"] for s in slots.status()] == [0, 0]


def test_a_busy_slot_lends_its_rows_but_is_never_chosen():
    slots = pool(3)
    first = filled(slots.acquire([1, 2, 3, 4]), [1, 2, 3, 4])  # a batch's first stream, still busy
    again = slots.acquire([1, 2, 3, 4, 5])  # would continue it, but it is being written
    assert again is not first and again.tokens == [1, 2, 3, 4] and first.tokens == [1, 2, 3, 4]
    third = slots.acquire([9, 9, 9])
    assert third is not first and third is not again
    try:
        slots.acquire([1, 2])
    except RuntimeError as exc:
        assert "every KV slot is busy" in str(exc)
    else:
        raise AssertionError("a fourth stream got one of three busy slots")
    slots.release()
    assert slots.acquire([1, 2, 3, 4, 5, 6]) in (first, again)  # free again: adopted whole


def test_the_only_free_slot_is_taken_when_the_best_match_is_busy():
    slots = pool(2)
    busy = filled(slots.acquire([5] * 10), [5] * 10)
    other = slots.acquire([5] * 10 + [6])
    assert other is not busy and other.tokens == [5] * 10


def _choice(key: str, rows: int, value: float = 1.0):
    import numpy as np

    from inference.engine.prefix import KVPrefix
    from inference.kv.prefix_source import PrefixChoice

    k = np.full((1, 1, rows, 2), value, np.float32)  # (L, kvh, rows, hd)
    return PrefixChoice(key, KVPrefix(k, k), (key,))


def test_a_slot_is_reused_only_under_the_same_prefix_key():
    slots = pool(2)
    alpha, beta = _choice("alpha", 3, 1.0), _choice("beta", 2, 2.0)
    a = filled(slots.acquire([1, 2, 3], alpha), [1, 2, 3])
    assert (a.prefix_key, a.prefix_rows, a.n_positions) == ("alpha", 3, 6)
    assert (a.k[0, 0, :3] == 1.0).all()
    slots.release()
    # The same tokens behind another prefix share nothing: another slot, the prefix installed.
    b = slots.acquire([1, 2, 3, 4], beta)
    assert b is not a and (b.prefix_key, b.prefix_rows, b.tokens) == ("beta", 2, [])
    assert (b.k[0, 0, :2] == 2.0).all()
    filled(b, [1, 2, 3])
    slots.release()
    assert slots.acquire([1, 2, 3, 4], alpha) is a and a.tokens == [1, 2, 3]
    assert [s["prefix_key"] for s in slots.status()] == ["alpha", "beta"]


def test_a_slot_taken_under_another_key_gets_the_new_prefix_and_loses_its_tokens():
    slots = pool(1)
    a = filled(slots.acquire([1, 2, 3], _choice("alpha", 3)), [1, 2, 3])
    slots.release()
    assert slots.acquire([1, 2, 3], _choice("beta", 4, 3.0)) is a
    assert (a.prefix_key, a.prefix_rows, a.tokens) == ("beta", 4, [])
    slots.release()
    assert slots.acquire([1, 2, 3]) is a and (a.prefix_key, a.prefix_rows) == ("", 0)


def test_a_shared_prefix_copy_carries_the_prefix_rows():
    slots = pool(2)
    alpha = _choice("alpha", 3, 5.0)
    donor = filled(slots.acquire([1, 2, 3, 4, 5], alpha), [1, 2, 3, 4, 5])
    slots.release()
    other = slots.acquire([1, 2, 3, 9, 9], alpha)
    assert other is not donor and other.tokens == [1, 2, 3]
    assert (other.prefix_key, other.prefix_rows) == ("alpha", 3) and (other.k[0, 0, :3] == 5.0).all()
