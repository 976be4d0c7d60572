"""The Celery mapper of the fan-out: one task per item, sent as a group, awaited in order.

The caller (a build running in this process or in a worker's task) polls the group: it reports
completions as they come, revokes what is left when the build is cancelled, and returns the
results in the items' order (a failed item re-raises its error here). Waiting inside a worker's
task is allowed (``disable_sync_subtasks=False``): the items run on other worker slots, so a
worker that runs a fleet job needs ``--concurrency 2`` or more, or another worker beside it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from .fanout import Cancelled

POLL_SECONDS = 0.2
DOCUMENT_TASK = "fleet.document_item"


def celery_map(
    name: str,
    items: Sequence[Any],
    on_done: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> list:
    """Run ``name`` over ``items`` as a Celery group and wait for every result."""
    from celery import group

    from lmserve_site.celery import app

    if not items:
        return []
    # By the task's name (fleet/tasks.py declares it), as jobs.py sends builds.
    result = group(app.signature(DOCUMENT_TASK, (name, item)) for item in items).apply_async()
    try:
        reported = -1
        while not result.ready():
            if cancelled is not None and cancelled():
                result.revoke()
                raise Cancelled(f"cancelled with {result.completed_count()} of {len(items)} items done")
            done = result.completed_count()
            if on_done is not None and done != reported:
                on_done(done, len(items))
                reported = done
            time.sleep(POLL_SECONDS)
        values = result.get(disable_sync_subtasks=False)
        if on_done is not None:
            on_done(len(items), len(items))
        return values
    finally:
        result.forget()
