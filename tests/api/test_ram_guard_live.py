"""The RAM guard at start-up of a real server: an absurd --kv-slots is clamped, or kept when forced.

SmolLM2-135M at --ctx 8192 prices a slot at 8192 x 30 layers x 3 kv heads x 128 x 2 bytes
(180 MiB: the cache holds float16); ten thousand of them exceed any machine this runs on.
Slot caches are allocated on first use, so a forced server starts all the same.
"""

from __future__ import annotations

import re

import httpx
import pytest

pytestmark = pytest.mark.slow  # a live server or a real model's long run

CLAMPED = re.compile(
    r"KV RAM guard: 10000 slot\(s\) x 180\.0 MiB = .* clamped to (\d+) slot\(s\) to fit half"
)


def test_too_many_slots_are_clamped_with_the_arithmetic_logged(start_server):
    server = start_server("--kv-slots", "10000", "--ctx", "8192")
    match = CLAMPED.search(server.logs())
    assert match, server.logs()
    assert 1 <= int(match.group(1)) < 10000


def test_forced_slots_are_kept_with_a_warning(start_server):
    server = start_server("--kv-slots", "10000", "--ctx", "8192", "--kv-slots-force")
    logs = server.logs()
    assert "--kv-slots-force given" in logs and "clamped" not in logs


def test_a_batch_prices_a_slot_per_stream_and_shrinks_to_the_clamp(start_server):
    """--batch raises --kv-slots (default 1) to one slot per stream before the guard prices
    them; when the guard clamps the slots, the batch narrows to the slots it left."""
    server = start_server("--batch", "10000", "--ctx", "8192")
    logs = server.logs()
    match = CLAMPED.search(logs)
    assert match, logs
    slots = int(match.group(1))
    assert f"--batch 10000 lowered to {slots}" in logs
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    assert f"lmserve_batch_width {float(slots)}" in metrics
