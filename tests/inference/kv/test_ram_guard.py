"""The start-up KV RAM guard: warn above half the available memory, clamp above all of it."""

from __future__ import annotations

from inference.kv.ram_guard import MIB, available_memory, judge_kv_slots

MEMINFO = """MemTotal:       24000000 kB
MemFree:         1000000 kB
MemAvailable:   16000000 kB
Buffers:          100000 kB
"""


def test_available_memory_reads_mem_available_in_bytes():
    assert available_memory(MEMINFO) == 16000000 * 1024
    assert available_memory("MemTotal: 5 kB\n") is None


def test_slots_within_half_pass_quietly_with_the_arithmetic():
    verdict = judge_kv_slots(4, 100 * MIB, 1000 * MIB)
    assert (verdict.slots, verdict.level) == (4, "info")
    assert "4 slot(s) x 100.0 MiB = 400.0 MiB of 1000.0 MiB available" in verdict.message


def test_slots_over_half_warn_but_are_kept():
    verdict = judge_kv_slots(7, 100 * MIB, 1000 * MIB)
    assert (verdict.slots, verdict.level) == (7, "warning")
    assert "over half" in verdict.message


def test_slots_over_everything_are_clamped_to_fit_half():
    verdict = judge_kv_slots(30, 100 * MIB, 1000 * MIB)
    assert (verdict.slots, verdict.level) == (5, "warning")
    assert "clamped to 5 slot(s)" in verdict.message


def test_force_keeps_the_slots_and_still_warns():
    verdict = judge_kv_slots(30, 100 * MIB, 1000 * MIB, force=True)
    assert (verdict.slots, verdict.level) == (30, "warning")
    assert "--kv-slots-force" in verdict.message


def test_a_slot_bigger_than_half_still_leaves_one():
    assert judge_kv_slots(3, 800 * MIB, 1000 * MIB).slots == 1


def test_unknown_memory_keeps_the_request():
    assert judge_kv_slots(9, 100 * MIB, None).slots == 9


def test_what_serving_will_take_is_set_aside_before_the_slots():
    # 400 MiB of slots fit half of 1000 MiB, not half of what 600 MiB of borrowed experts
    # and fleet cartridges leave; with 900 MiB set aside one slot is all that fits.
    verdict = judge_kv_slots(4, 100 * MIB, 1000 * MIB, reserved=600 * MIB)
    assert (verdict.slots, verdict.level) == (4, "warning")
    assert "less 600.0 MiB kept for serving the model and its prefixes" in verdict.message
    assert judge_kv_slots(4, 100 * MIB, 1000 * MIB, reserved=900 * MIB).slots == 1
    assert judge_kv_slots(4, 100 * MIB, 1000 * MIB, reserved=2000 * MIB).slots == 1
