"""Build jobs in-process: the job row as progress, success, failure, cancellation; the fan-out
seam; the loss curve picture. (The Celery path is tests/fleet/test_celery_jobs.py.)"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest

from fleet.cartridges.build import CartridgeBuildSpec
from fleet.cartridges.file import load_cartridge
from fleet.models import BuildJob, Cartridge
from fleet.services import fanout, jobs
from fleet.services.cartridges import create_cartridge_job, run_cartridge_job
from fleet.services.lossplot import loss_curve_svg
from fleet.services.progress import JobProgress
from inference.engine.engine import Engine
from tests.fixtures.synthetic_gguf import synthetic_path

from . import fanout_tasks

pytestmark = pytest.mark.django_db

CORPUS = "The Zorblax 3000 is a made-up kettle. It boils water in 42 seconds and sings when done. " * 4


@pytest.fixture
def model(synthetic_dir) -> Path:
    return synthetic_path("llama", synthetic_dir)


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "manual.txt"
    path.write_text(CORPUS, encoding="utf-8")
    return path


def _spec(corpus: Path, model: Path, tmp_path: Path, p: int = 16) -> CartridgeBuildSpec:
    return CartridgeBuildSpec(corpus=corpus, out=tmp_path / "c.safetensors", model=model, prefix_tokens=p)


@pytest.mark.slow
def test_a_cartridge_job_succeeds_and_records_the_cartridge(corpus, model, tmp_path):
    job = create_cartridge_job(_spec(corpus, model, tmp_path))
    assert job.state == "queued" and job.parameters["prefix_tokens"] == 16
    job = run_cartridge_job(job.pk)
    assert job.state == "succeeded", job.error
    assert job.progress == 1.0 and job.started <= job.finished and job.error == ""
    assert job.result["rows"] == 16 and job.result["path"] == str(tmp_path / "c.safetensors")
    assert "building" in job.log and job.log.rstrip().endswith("done")
    row = Cartridge.objects.get()
    engine = Engine.load(model)
    assert row.model_fingerprint == engine.fingerprint.hex() and row.rows == 16
    assert row.status == "ready" and row.job_id == job.pk and row.corpus_name == "manual.txt"
    assert len(row.corpus_digest) == 64 and row.file_bytes == (tmp_path / "c.safetensors").stat().st_size
    assert load_cartridge(row.path).rows == 16
    # a second run of the same job (a redelivered message) does nothing
    assert run_cartridge_job(job.pk).finished == job.finished


@pytest.mark.slow
def test_a_trained_job_keeps_conversations_coverage_and_both_loss_curves(corpus, model, tmp_path):
    spec = replace(_spec(corpus, model, tmp_path, p=8), steps=2)
    job = run_cartridge_job(create_cartridge_job(spec).pk)
    assert job.state == "succeeded", job.error
    assert job.conversations == 2 * spec.accum and job.coverage == job.result["coverage"] > 0
    row = Cartridge.objects.get()
    assert [step for step, _ in row.loss_history] == [1, 2]
    assert [step for step, _ in row.held_out_history] == [0, 2]
    assert row.held_out_history[0][1] == job.result["loss_first"]
    assert job.held_out_loss == row.held_out_history[-1][1]


def test_a_bad_build_fails_with_the_reason_and_leaves_no_cartridge(corpus, model, tmp_path):
    job = run_cartridge_job(create_cartridge_job(_spec(corpus, model, tmp_path, p=100_000)).pk)
    assert job.state == "failed"
    assert "ValueError" in job.error and "--prefix-tokens 100000" in job.error
    assert "Traceback" in job.log
    assert not Cartridge.objects.exists() and not (tmp_path / "c.safetensors").exists()


def test_cancelling_a_queued_job_stops_it_before_it_starts(corpus, model, tmp_path):
    job = create_cartridge_job(_spec(corpus, model, tmp_path))
    assert jobs.cancel(job.pk) == "cancelled"
    job = run_cartridge_job(job.pk)
    assert job.state == "cancelled" and job.error == "cancelled before it started" and job.started is None
    assert not (tmp_path / "c.safetensors").exists()
    with pytest.raises(jobs.JobError, match="already finished"):
        jobs.cancel(job.pk)
    with pytest.raises(jobs.JobError, match="no build job"):
        jobs.cancel(job.pk + 1000)


def test_a_cancel_that_arrives_while_running_stops_the_build_and_says_why(corpus, model, tmp_path):
    job = create_cartridge_job(_spec(corpus, model, tmp_path))
    # The request lands between the claim and the build's check (the admin's button mid-build).
    BuildJob.objects.filter(pk=job.pk).update(cancel_requested=True)
    job = run_cartridge_job(job.pk)
    assert job.state == "cancelled" and job.started is not None
    assert job.error.startswith("cancelled on request: cancelled before writing")
    assert not (tmp_path / "c.safetensors").exists() and not Cartridge.objects.exists()


def test_a_running_job_is_asked_to_stop_through_its_row():
    job = jobs.create_job("cartridge", {})
    jobs.claim(job.pk)
    progress = JobProgress(job, interval=0.0)
    assert not progress.cancelled()
    assert jobs.cancel(job.pk) == "requested"
    assert progress.cancelled()
    assert BuildJob.objects.get(pk=job.pk).state == "running"  # the build decides when it stops


def test_progress_writes_are_throttled_and_the_last_step_is_always_written():
    job = jobs.create_job("cartridge", {})
    now = [0.0]
    progress = JobProgress(job, interval=1.0, clock=lambda: now[0])
    progress.on_step(1, 10, 2.5)  # first write goes through
    now[0] = 0.5
    progress.on_step(2, 10, 2.0)  # within the interval: kept in memory only
    row = BuildJob.objects.get(pk=job.pk)
    assert (row.step, row.total, row.loss) == (1, 10, 2.5)
    now[0] = 1.6
    progress.on_step(3, 10, 1.5)
    row = BuildJob.objects.get(pk=job.pk)
    assert (row.step, row.progress, row.loss) == (3, 0.3, 1.5)
    now[0] = 1.7
    progress.on_step(10, 10, 1.0)  # the last step, inside the interval: written anyway
    row = BuildJob.objects.get(pk=job.pk)
    assert (row.step, row.progress, row.loss) == (10, 1.0, 1.0)
    assert progress.losses == [[1, 2.5], [2, 2.0], [3, 1.5], [10, 1.0]]


def test_progress_records_conversations_coverage_and_every_held_out_loss():
    job = jobs.create_job("cartridge", {})
    now = [0.0]
    progress = JobProgress(job, interval=1.0, clock=lambda: now[0])
    progress.on_conversations(16, 2.5)  # first write goes through
    progress.on_held_out(0, 3.25)  # held-out points are rare: always written
    row = BuildJob.objects.get(pk=job.pk)
    assert (row.conversations, row.coverage, row.held_out_loss) == (16, 2.5, 3.25)
    progress.on_conversations(32, 5.0)  # within the interval: kept in memory only
    assert BuildJob.objects.get(pk=job.pk).conversations == 16
    progress.on_held_out(8, 3.0)
    row = BuildJob.objects.get(pk=job.pk)
    assert (row.conversations, row.coverage, row.held_out_loss) == (32, 5.0, 3.0)
    assert progress.held_out == [[0, 3.25], [8, 3.0]]


def test_fanout_runs_in_process_by_default_and_through_an_installed_mapper():
    items = [{"n": n} for n in range(5)]
    done = []
    square = fanout_tasks.square_with_pid
    results = fanout.map_documents(square, items, on_done=lambda d, t: done.append((d, t)))
    assert [r["square"] for r in results] == [0, 1, 4, 9, 16] and done[-1] == (5, 5)
    calls = []

    def recording(name, items, on_done, cancelled):
        calls.append(name)
        return fanout.run_in_process(name, items, on_done, cancelled)

    with fanout.using(recording):
        assert fanout.map_documents(fanout_tasks.square_with_pid, items[:2])[1]["square"] == 1
    assert calls == ["tests.fleet.fanout_tasks:square_with_pid"]
    assert fanout.current_mapper_name() == "in-process"
    with pytest.raises(fanout.Cancelled, match="after 0 of 5"):
        fanout.map_documents(fanout_tasks.square_with_pid, items, cancelled=lambda: True)


def test_fanout_runs_only_document_tasks():
    with pytest.raises(TypeError, match="document_task"):
        fanout.task_name(fanout_tasks.unmarked)
    for name in ("tests.fleet.fanout_tasks:unmarked", "os:system", "os.system", "nonsense"):
        with pytest.raises(ValueError):
            fanout.resolve(name)
    assert fanout.resolve("tests.fleet.fanout_tasks.square_with_pid") is fanout_tasks.square_with_pid
    assert fanout.resolve("fleet.services.lossplot:loss_curve_svg") is loss_curve_svg  # the app's own


def test_loss_curve_is_an_svg_with_one_point_per_step():
    svg = loss_curve_svg([[1, 3.0], [2, 2.0], [3, 1.25]], title="c <1>")
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    (line,) = root.iter(ns + "polyline")
    points = [tuple(map(float, p.split(","))) for p in line.get("points").split()]
    assert len(points) == 3 and points[0][0] < points[1][0] < points[2][0]
    assert points[0][1] < points[2][1]  # higher loss is drawn higher (smaller y)
    assert root.find(ns + "title").text == "c <1>"
    assert "no loss recorded" in loss_curve_svg([])


def test_loss_curve_draws_the_held_out_loss_on_the_same_axes_with_a_legend():
    svg = loss_curve_svg([[1, 3.0], [2, 2.0], [8, 1.0]], held_out=[[0, 3.5], [8, 2.5]])
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    train, held = root.iter(ns + "polyline")
    assert (train.get("class"), held.get("class")) == ("loss", "held-out")
    train_x = [float(p.split(",")[0]) for p in train.get("points").split()]
    held_x = [float(p.split(",")[0]) for p in held.get("points").split()]
    assert held_x[0] < train_x[0] and held_x[-1] == train_x[-1]  # step 0 .. 8 on one axis
    legend = [t.text for t in root.iter(ns + "text") if t.get("class") == "legend"]
    assert legend == ["loss", "held-out"]
    assert len(list(ET.fromstring(loss_curve_svg([[1, 3.0]])).iter(ns + "polyline"))) == 1


def test_build_cartridge_command_prints_the_summary_and_records_the_job(corpus, model, tmp_path, capsys):
    from django.core.management import call_command

    out = tmp_path / "cmd.safetensors"
    args = [str(corpus), "--out", str(out), "--model", str(model), "--prefix-tokens", "8"]
    call_command("build_cartridge", *args)
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(summary) == {
        "path",
        "rows",
        "steps",
        "loss_first",
        "loss_last",
        "seconds",
        "best_step",
        "conversations",
        "coverage",
    }
    assert summary["rows"] == 8 and summary["steps"] == 0 and Path(summary["path"]) == out
    job = BuildJob.objects.get()
    assert job.state == "succeeded" and job.runner == "in-process" and job.result == summary
    assert Cartridge.objects.get().rows == 8


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.txt", "--out", "x.safetensors"], "no such corpus file"),
        (["{corpus}", "--out", "x.safetensors", "--prefix-tokens", "0"], "--prefix-tokens must be >= 1"),
        (["{corpus}", "--out", "x.safetensors", "--synthesis-share", "1"], "--synthesis-share 1 must be"),
        (["{corpus}", "--out", "x.safetensors", "--model", "no-such-model"], "no-such-model"),
        (["{corpus}", "--out", "x.safetensors", "--model", "{model}", "--celery"], "CELERY_BROKER_URL"),
        (["{corpus}", "--out", "x.safetensors", "--model", "{model}", "--prefix-tokens", "9999"], "9999"),
    ],
)
def test_build_cartridge_command_refuses_bad_input_clearly(corpus, model, tmp_path, args, message, settings):
    from django.core.management import CommandError, call_command

    settings.CELERY_BROKER_URL = ""
    args = [a.format(corpus=corpus, model=model) for a in args]
    args[2] = str(tmp_path / args[2])
    with pytest.raises(CommandError, match=message):
        call_command("build_cartridge", *args)


def test_a_running_job_whose_process_ended_is_marked_failed():
    import socket
    import subprocess
    import sys

    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(ended.stdout)
    host = socket.gethostname()
    orphan, alive, elsewhere = (jobs.create_job("cartridge", {}) for _ in range(3))
    for job in (orphan, alive, elsewhere):
        assert jobs.claim(job.pk).process == f"{host}:{os.getpid()}"
    BuildJob.objects.filter(pk=orphan.pk).update(process=f"{host}:{dead_pid}")
    BuildJob.objects.filter(pk=elsewhere.pk).update(process=f"another-host:{dead_pid}")
    assert jobs.fail_orphans() == 1
    orphan.refresh_from_db()
    assert orphan.state == "failed" and f"({host}:{dead_pid}) ended before the build did" in orphan.error
    assert {j.state for j in BuildJob.objects.exclude(pk=orphan.pk)} == {"running"}
