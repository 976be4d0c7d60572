"""The start-up KV RAM guard: does ``--kv-slots`` x one full ``--ctx`` cache fit in memory?

Slot caches commit their pages lazily, so an overcommit does not fail at start-up: it shows up
mid-serving as the OS evicting the page cache of the mmap'd weights, a silent throughput
collapse. The guard prices one slot, compares the total with the memory available now, warns
above half of it and, above all of it, clamps the slot count to fit half (unless forced).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MEMINFO = Path("/proc/meminfo")
MIB = 1024 * 1024


@dataclass(frozen=True)
class RamVerdict:
    """How many slots to run and what to tell the operator (``level`` is a logging level name)."""

    slots: int
    level: str  # "info", "warning"
    message: str


def available_memory(meminfo: str | None = None) -> int | None:
    """Bytes the kernel says can be allocated without swapping (MemAvailable), or None when the
    platform does not say (no /proc/meminfo): then the guard cannot judge and stays silent."""
    if meminfo is None:
        try:
            meminfo = MEMINFO.read_text()
        except OSError:
            return None
    for line in meminfo.splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "MemAvailable":
            fields = rest.split()
            scale = 1024 if len(fields) > 1 and fields[1].lower() == "kb" else 1
            return int(fields[0]) * scale
    return None


def judge_kv_slots(
    requested: int, slot_bytes: int, available: int | None, force: bool = False, reserved: int = 0
) -> RamVerdict:
    """The slot count to run with, given the price of one slot and the memory available, of
    which ``reserved`` bytes go to what the model and the prefix source take once serving
    (borrowed experts' pages and caches, a fleet's cartridges): the slots get the rest."""
    if available is None:
        return RamVerdict(requested, "info", f"KV RAM guard: available memory unknown; {requested} slot(s)")
    total = requested * slot_bytes
    room = max(0, available - reserved)
    kept = f" less {reserved / MIB:.1f} MiB kept for serving the model and its prefixes" if reserved else ""
    arithmetic = (
        f"KV RAM guard: {requested} slot(s) x {slot_bytes / MIB:.1f} MiB = {total / MIB:.1f} MiB "
        f"of {available / MIB:.1f} MiB available{kept}"
    )
    if total <= room // 2:
        return RamVerdict(requested, "info", arithmetic)
    if total <= room or force:
        why = "--kv-slots-force given; " if total > room else ""
        return RamVerdict(
            requested,
            "warning",
            f"{arithmetic}: over half of it; {why}the OS may evict the model's weights from the page cache",
        )
    fitting = max(1, (room // 2) // max(1, slot_bytes))
    return RamVerdict(
        fitting,
        "warning",
        f"{arithmetic}: more than is available; clamped to {fitting} slot(s) to fit half "
        "(--kv-slots-force keeps the requested count)",
    )
