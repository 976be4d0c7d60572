"""The RAM guard at start-up of a real server: an absurd --kv-slots is clamped, or kept when forced.

SmolLM2-135M at --ctx 8192 prices a slot at 8192 x 30 layers x 3 kv heads x 128 x 2 bytes
(180 MiB: the cache holds float16); ten thousand of them exceed any machine this runs on.
Slot caches are allocated on first use, so a forced server starts all the same.
"""

from __future__ import annotations

import re

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
