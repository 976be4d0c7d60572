"""CI fuzzes a live server with schemathesis against its own /openapi.json: valid and invalid
bodies on every endpoint, bounded in examples and time. No 5xx (but a deliberate 501), no
request that hangs, every response as the document says and every error in its dialect's
envelope (tests/api/schemathesis_hooks.py).

The server runs the synthetic think model (tests/fixtures/think_gguf.py): a real GGUF through
the real engine whose replies are short, so generations that the fuzzer gets through cost
little time, with a small context bounding the ones that ignore the end of turn.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.think_gguf import think_model_path

from .conftest import API_KEY, start_lmserve

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HERE = Path(__file__).resolve().parent
MAX_EXAMPLES = 25  # per operation and phase
MAX_SECONDS = 120  # the whole run's budget; schemathesis stops generating when it is spent
REQUEST_TIMEOUT = 60  # a request taking longer counts as a hang


def test_schemathesis_finds_no_server_error(tmp_path, synthetic_dir):
    model = think_model_path(synthetic_dir)
    (tmp_path / "server").mkdir()
    server = start_lmserve(tmp_path / "server", str(model), "--api-key", API_KEY, "--ctx", "256")
    try:
        run = subprocess.run(
            [
                str(Path(sys.executable).with_name("st")),
                "--no-color",
                "--config-file",
                str(HERE / "schemathesis.toml"),
                "run",
                server.url + "/openapi.json",
                "--url",
                server.url,
                "--header",
                f"Authorization: Bearer {API_KEY}",
                "--checks",
                "not_a_server_error,status_code_conformance,content_type_conformance,"
                "response_schema_conformance,dialect_error_envelope",
                "--mode",
                "all",
                "--phases",
                "coverage,fuzzing",
                "--max-examples",
                str(MAX_EXAMPLES),
                "--max-time",
                str(MAX_SECONDS),
                "--request-timeout",
                str(REQUEST_TIMEOUT),
                "--workers",
                "1",
                "--seed",
                "19",
                "--generation-database",
                "none",
            ],
            cwd=tmp_path,  # its .schemathesis and .hypothesis caches stay out of the checkout
            env={
                **os.environ,
                "PYTHONPATH": str(HERE.parents[1]),
                "SCHEMATHESIS_HOOKS": "tests.api.schemathesis_hooks",
            },
            capture_output=True,
            text=True,
            timeout=MAX_SECONDS + 240,
        )
    finally:
        server.stop()
    report = run.stdout[-12000:] + run.stderr[-4000:]
    (tmp_path / "schemathesis.txt").write_text(run.stdout + run.stderr)
    assert run.returncode == 0, f"schemathesis found problems:\n{report}"
    assert "passed" in run.stdout, report
