"""Document tasks for the fan-out tests (importable by a Celery worker started from the checkout)."""

from __future__ import annotations

import os

from fleet.services.fanout import document_task


@document_task
def square_with_pid(item: dict) -> dict:
    """The item's square and the process that computed it."""
    return {"square": item["n"] * item["n"], "pid": os.getpid()}


@document_task
def fail_on_three(item: dict) -> int:
    if item["n"] == 3:
        raise ValueError("item 3 is refused")
    return item["n"]


def unmarked(item: dict) -> int:
    return item["n"]


@document_task
def slow_square(item: dict) -> int:
    """The square after ``item["sleep"]`` seconds (long enough to cancel in the middle)."""
    import time

    time.sleep(item["sleep"])
    return item["n"] * item["n"]
