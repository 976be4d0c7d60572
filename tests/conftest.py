"""Fixtures shared across the suite."""

from __future__ import annotations

import os
from pathlib import Path

# As in manage.py: keep OpenBLAS from spinning against numba's threads (set before numpy loads).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import pytest


@pytest.fixture(scope="session")
def synthetic_dir(tmp_path_factory) -> Path:
    """Where the synthetic GGUF models are written, once per test session."""
    return tmp_path_factory.mktemp("synthetic-gguf")
