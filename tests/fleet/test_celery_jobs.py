"""Builds on a real Celery worker over a real Redis (tests/fleet/celery_fixtures.py): the
command's --celery path end to end, and the fan-out as a Celery group (order, errors, cancel)."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.synthetic_gguf import synthetic_path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def test_build_cartridge_runs_on_the_worker_and_reports_through_the_job_row(
    celery_world, synthetic_dir, tmp_path
):
    model = synthetic_path("llama", synthetic_dir)
    corpus = tmp_path / "manual.txt"
    corpus.write_text("The Zorblax 3000 kettle boils water in 42 seconds and then it sings. " * 4)
    out = tmp_path / "worker.safetensors"
    args = ["build_cartridge", str(corpus), "--out", str(out), "--model", str(model), "--prefix-tokens", "12"]
    done = celery_world.manage(*args, "--celery")
    assert done.returncode == 0, done.stderr
    summary = _last_json(done.stdout)
    assert summary["rows"] == 12 and summary["path"] == str(out) and out.is_file()
    (job,) = celery_world.rows("SELECT * FROM fleet_buildjob")
    assert job["state"] == "succeeded" and job["runner"] == "celery" and job["celery_task_id"]
    assert json.loads(job["result"]) == summary and job["progress"] == 1.0
    (cartridge,) = celery_world.rows("SELECT * FROM fleet_cartridge")
    assert cartridge["rows"] == 12 and cartridge["status"] == "ready" and cartridge["job_id"] == job["id"]
    log = celery_world.worker_log.read_text()
    assert f"Task fleet.build_cartridge[{job['celery_task_id']}] succeeded" in log


def test_a_failed_celery_build_says_why_on_the_command_line(celery_world, synthetic_dir, tmp_path):
    model = synthetic_path("llama", synthetic_dir)
    corpus = tmp_path / "short.txt"
    corpus.write_text("Too short.")
    args = ["build_cartridge", str(corpus), "--out", str(tmp_path / "x.safetensors"), "--model", str(model)]
    done = celery_world.manage(*args, "--prefix-tokens", "500", "--celery")
    assert done.returncode != 0 and "failed: ValueError: --prefix-tokens 500" in done.stderr
    job = celery_world.rows("SELECT * FROM fleet_buildjob ORDER BY id DESC LIMIT 1")[0]
    assert job["state"] == "failed" and "--prefix-tokens 500" in job["error"] and job["runner"] == "celery"


FANOUT = """
import json, os
from fleet.services.celery_fanout import celery_map
from fleet.services.fanout import Cancelled
out = {"me": os.getpid()}
items = [{"n": n} for n in range(6)]
done = []
out["results"] = celery_map("tests.fleet.fanout_tasks:square_with_pid", items, lambda d, t: done.append(d))
out["done"] = done
try:
    celery_map("tests.fleet.fanout_tasks:fail_on_three", items)
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
try:
    celery_map("os:system", [{"n": 1}])
except Exception as exc:
    out["refused"] = str(exc)
slow = [{"n": n, "sleep": 1.0} for n in range(8)]
seen = [0]
try:
    celery_map(
        "tests.fleet.fanout_tasks:slow_square", slow, lambda d, t: seen.append(d), lambda: max(seen) >= 2
    )
except Cancelled as exc:
    out["cancelled"] = str(exc)
print(json.dumps(out))
"""


def test_fanout_runs_a_celery_group_on_the_worker_processes(celery_world):
    done = celery_world.manage("shell", "-c", FANOUT)
    assert done.returncode == 0, done.stderr
    out = _last_json(done.stdout)
    assert [r["square"] for r in out["results"]] == [0, 1, 4, 9, 16, 25]  # in the items' order
    pids = {r["pid"] for r in out["results"]}
    assert out["me"] not in pids and celery_world.worker_pid not in pids  # the pool's children ran them
    assert out["done"][-1] == 6 and out["done"] == sorted(out["done"])
    assert out["error"] == "ValueError: item 3 is refused"
    assert "is not a document task" in out["refused"]
    assert out["cancelled"].startswith("cancelled with") and "of 8 items done" in out["cancelled"]
    assert int(out["cancelled"].split()[2]) < 8
