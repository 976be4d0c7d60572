"""Fixtures shared across the suite."""

from __future__ import annotations

import os
from pathlib import Path

# As in manage.py: keep OpenBLAS from spinning against numba's threads (set before numpy loads).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import pytest


@pytest.fixture(autouse=True)
def _allowed_hosts_restored():
    """``manage.py lmserve`` run in-process (the flag tests) sets ALLOWED_HOSTS for the server
    it would start, dropping the test client's ``testserver``: put the list back after each
    test, so a later admin test in the same process is not answered 400 (it depended on the
    order of the files, which pytest -n changes)."""
    from django.conf import settings

    saved = list(settings.ALLOWED_HOSTS)
    yield
    settings.ALLOWED_HOSTS = saved


@pytest.fixture(scope="session")
def synthetic_dir(tmp_path_factory) -> Path:
    """Where the synthetic GGUF models are written, once per test session."""
    return tmp_path_factory.mktemp("synthetic-gguf")


# Fixtures that start a manage.py server process (or a redis-server and a Celery worker): a test
# using one (even through another fixture) is a live-server test and belongs to the slow tier.
LIVE_SERVER_FIXTURES = frozenset(
    {"server", "start_server", "model_server", "redis_url", "celery_world", "faults"}
)


# The slow tier's longest files (1.5-4.5 minutes each on two cores), collected first so that
# pytest -n starts them first: its processes then finish together, where one used to run the
# soak alone for its last minutes.
LONGEST_FIRST = (
    "tests/api/test_soak_live.py",
    "tests/fleet/test_celery_faults.py",
    "tests/api/test_openapi_fuzz.py",
    "tests/inference/engine/jit/test_simd_models.py",
    "tests/api/test_constraints.py",
    "tests/api/test_batch_live.py",
)


def _start_rank(item) -> int:
    path = item.nodeid.split("::")[0]
    return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items) -> None:
    """Refuse a live-server test that is not marked slow (the fast tier must stay unit tests),
    and put the longest files first (a stable sort: the rest keep their order)."""
    unmarked = [
        item.nodeid
        for item in items
        if LIVE_SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("slow") is None
    ]
    if unmarked:
        raise pytest.UsageError("live-server tests must be marked slow: " + ", ".join(unmarked))
    items.sort(key=_start_rank)
