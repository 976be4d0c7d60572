"""Cartridge builds on a real Celery worker over a real Redis when things go wrong: the worker
killed (``kill -9``) mid-build, Redis stopped mid-build, a cancel during synthesis and during
training. Each ends with the job row saying what happened, no cartridge file (whole or partial)
at the output path unless the build succeeded, and a build started again reusing the dataset
shards the interrupted one wrote.

Each test has its own Redis and worker (the worker in a process group of its own, so it can be
killed whole). The model is the synthetic llama (SmolLM2's tokenizer, four small layers) and
the self-study settings are tiny, so a build takes seconds of synthesis and a few seconds a step.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fleet.cartridges.file import load_cartridge
from tests.fixtures.synthetic_gguf import synthetic_path

from .conftest import ROOT, RedisServer, manage, start_worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
# Deadlines, not measurements: the slow tier runs two test processes on two cores, and a build
# that took 19 s alone took 78 s beside another test on a fast machine.
FAILED_WITHIN = 180.0  # a killed build's job row says so (a fresh worker starts, then looks)
CANCELLED_WITHIN = 300.0  # a cancel lands after the batch or step in hand
BUILD_WITHIN = 600.0  # a 24-step build on the synthetic model finishes

CORPUS = (
    "Mirabel bread is a sweet braided loaf from the hill town of Ostmark. Bakers knead the dough "
    "with saffron, honey and a little rye, rest it overnight in a cold cellar and braid it in six "
    "strands at dawn. It is baked on a stone for forty minutes and glazed with milk and sugar."
)
SEEDED = 4  # training conversations the dataset holds before the build (with its held-out four)
BATCH = 16  # conversations a build synthesises at a time (ConversationPool's batch)


@dataclass
class Faults:
    """One test's Redis, worker, data directory, corpus and dataset."""

    root: Path
    redis: RedisServer
    env: dict
    model: Path
    worker: subprocess.Popen | None = None
    workers: int = 0
    watchers: list[subprocess.Popen] = field(default_factory=list)

    @property
    def corpus(self) -> Path:
        return self.root / "corpus.txt"

    @property
    def dataset(self) -> Path:
        return self.root / "dataset"

    @property
    def out(self) -> Path:
        return self.root / "out" / "manual.safetensors"

    def manage(self, *args: str) -> subprocess.CompletedProcess:
        return manage(self.env, *args, timeout=BUILD_WITHIN)

    def build_args(self, steps: int) -> list[str]:
        return [
            "build_cartridge",
            str(self.corpus),
            "--out",
            str(self.out),
            "--model",
            str(self.model),
            "--prefix-tokens",
            "16",
            "--steps",
            str(steps),
            "--dataset",
            str(self.dataset),
            "--celery",
        ]

    def watch_build(self, steps: int) -> subprocess.Popen:
        """``build_cartridge --celery`` in the background: it sends the job and follows its row."""
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *self.build_args(steps)],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.watchers.append(process)
        return process

    def start_unwatched(self, steps: int) -> int:
        """A cartridge job sent to the worker with nobody following it; its id."""
        code = (
            "from pathlib import Path\n"
            "from fleet.cartridges.build import CartridgeBuildSpec\n"
            "from fleet.services.cartridges import create_cartridge_job\n"
            "from fleet.services.jobs import start\n"
            f"spec = CartridgeBuildSpec(Path({str(self.corpus)!r}), Path({str(self.out)!r}), "
            f"Path({str(self.model)!r}), 16, {steps}, dataset=Path({str(self.dataset)!r}))\n"
            "print(start(create_cartridge_job(spec), 'celery').pk)\n"
        )
        done = self.manage("shell", "-c", code)
        assert done.returncode == 0, done.stderr
        return int(done.stdout.split()[-1])

    def start_worker(self) -> None:
        self.workers += 1
        log = self.root / f"worker{self.workers}.log"
        self.worker = start_worker(self.env, log, concurrency=1, new_session=True)

    def worker_log(self) -> str:
        return "".join(p.read_text() for p in sorted(self.root.glob("worker*.log")))

    def kill_worker(self) -> None:
        """``kill -9`` every process of the worker (its parent and its pool) at once."""
        os.killpg(self.worker.pid, signal.SIGKILL)
        self.worker.wait()

    def job(self, job_id: int | None = None) -> dict:
        with sqlite3.connect(self.root / "data" / "db.sqlite3") as db:
            db.row_factory = sqlite3.Row
            if job_id is None:
                row = db.execute("SELECT * FROM fleet_buildjob ORDER BY id DESC LIMIT 1").fetchone()
            else:
                row = db.execute("SELECT * FROM fleet_buildjob WHERE id = ?", (job_id,)).fetchone()
        assert row is not None, "no build job yet"
        return dict(row)

    def wait_job(self, condition, timeout: float = BUILD_WITHIN, job_id: int | None = None) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                job = self.job(job_id)
            except AssertionError:
                job = None
            if job is not None and condition(job):
                return job
            if (
                job is not None
                and job["state"] in ("succeeded", "failed", "cancelled")
                and not condition(job)
            ):
                raise AssertionError(f"job ended before the condition held: {job}")
            time.sleep(0.2)
        raise TimeoutError(f"condition not reached; last row {job}\n{self.worker_log()[-4000:]}")

    def cancel(self, job_id: int) -> str:
        done = self.manage("shell", "-c", f"from fleet.services.jobs import cancel; print(cancel({job_id}))")
        assert done.returncode == 0, done.stderr
        return done.stdout.split()[-1]  # after the shell's own banner

    def no_output_written(self) -> None:
        """Neither the cartridge nor a temporary file of it is in the output directory."""
        assert sorted(p.name for p in self.out.parent.iterdir()) == []

    def shards(self) -> dict[str, int]:
        return {p.name: p.stat().st_size for p in sorted(self.dataset.glob("*.jsonl"))}


@pytest.fixture
def faults(tmp_path, synthetic_dir) -> Faults:
    redis = RedisServer.start(tmp_path)
    env = {**os.environ, "LMSERVE_DATA_DIR": str(tmp_path / "data"), "CELERY_BROKER_URL": redis.url}
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("LMSERVE_MODEL", None)
    world = Faults(tmp_path, redis, env, synthetic_path("llama", synthetic_dir))
    world.corpus.write_text(CORPUS)
    world.out.parent.mkdir()
    for args in (
        ["migrate", "--noinput"],
        # The dataset's first shards carry its self-study settings, which every build on it then
        # uses: 8-token questions and 16-token answers.
        [
            "synthesize_selfstudy",
            str(world.corpus),
            "--dataset",
            str(world.dataset),
            "--model",
            str(world.model),
            "--conversations",
            str(SEEDED),
            "--held-out",
            "4",
            "--max-question",
            "8",
            "--max-answer",
            "16",
        ],
    ):
        done = world.manage(*args)
        assert done.returncode == 0, done.stderr
    world.start_worker()
    yield world
    for process in world.watchers:
        if process.poll() is None:
            process.kill()
            process.wait()
    if world.worker is not None and world.worker.poll() is None:
        world.worker.send_signal(signal.SIGTERM)
        try:
            world.worker.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(world.worker.pid, signal.SIGKILL)
            world.worker.wait()
    redis.stop()


def _summary(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def test_a_pool_process_killed_mid_training_fails_the_job_at_once_and_a_rerun_resumes_training(faults):
    # The training state is saved after each held-out evaluation (every 8 steps); steps to
    # spare, as a step of the synthetic model takes a fraction of a second on an idle machine.
    steps = 40
    watcher = faults.watch_build(steps)
    job = faults.wait_job(lambda j: j["state"] == "running" and j["step"] >= 9)
    pid = int(job["process"].rpartition(":")[2])
    assert pid != faults.worker.pid  # the pool's child runs the build
    os.kill(pid, signal.SIGKILL)
    job = faults.wait_job(lambda j: j["state"] == "failed", timeout=FAILED_WITHIN)
    # Whichever notices first says so: the worker's parent (its task_failure) or the watching
    # command, which finds the process gone.
    assert job["error"].startswith(
        (
            "worker lost: Worker exited prematurely: signal 9 (SIGKILL)",
            "worker lost: the process running it (",
        )
    ), job["error"]
    assert job["finished"] and 9 <= job["step"] < steps
    _, stderr = watcher.communicate(timeout=60)
    assert watcher.returncode == 1 and f"job #{job['id']} failed: worker lost" in stderr
    faults.no_output_written()
    assert faults.worker.poll() is None  # the worker itself lives on, with a fresh pool process
    assert len(list(faults.dataset.glob("train-state-*.npz"))) == 1

    done = faults.manage(*faults.build_args(steps))
    assert done.returncode == 0, done.stderr
    rerun = faults.job()
    resumed = re.search(r"training resumed at step (\d+) ", rerun["log"])
    assert rerun["state"] == "succeeded" and resumed, rerun["log"]
    assert int(resumed[1]) % 8 == 0 and 8 <= int(resumed[1]) <= job["step"]  # the last save before the kill
    assert _summary(done.stdout)["steps"] == steps and load_cartridge(faults.out).rows == 16
    assert list(faults.dataset.glob("train-state-*.npz")) == []


def test_a_worker_killed_whole_mid_synthesis_is_failed_by_the_next_one_and_a_rerun_resumes(faults):
    steps = 9  # 36 training conversations: the seeded 4, then two batches of 16
    job_id = faults.start_unwatched(steps)
    faults.wait_job(lambda j: j["conversations"] >= SEEDED + BATCH and j["step"] == 0, job_id=job_id)
    faults.kill_worker()
    assert faults.job(job_id)["state"] == "running"  # nobody is left to say otherwise
    faults.no_output_written()
    shard = f"train-{SEEDED:06d}-{steps * 4:06d}.jsonl"
    before = faults.shards()[shard]  # the batches made before the kill are on disk

    faults.start_worker()
    job = faults.wait_job(lambda j: j["state"] == "failed", timeout=FAILED_WITHIN, job_id=job_id)
    assert job["error"].startswith("worker lost: the process running it (") and "ended before" in job["error"]

    done = faults.manage(*faults.build_args(steps))
    assert done.returncode == 0, done.stderr
    rerun = faults.job()
    assert rerun["id"] != job_id and rerun["state"] == "succeeded"
    found = re.search(r"dataset dataset: (\d+) training and 4 held-out conversations on disk", rerun["log"])
    assert found and int(found[1]) >= SEEDED + BATCH, rerun["log"]  # not made again
    assert faults.shards()[shard] == before  # kept as it was: the rest went to a shard of its own
    assert load_cartridge(faults.out).rows == 16 and _summary(done.stdout)["steps"] == steps


def test_redis_stopped_mid_build_does_not_stop_the_build(faults):
    # Steps to spare: a 3-step build on a fast idle machine ran start to finish (2 s) between two
    # looks at the job, and Redis must stop while it is still running.
    steps = 24
    watcher = faults.watch_build(steps=steps)
    faults.wait_job(lambda j: j["state"] == "running" and j["step"] >= 1)
    faults.redis.stop()
    job = faults.wait_job(lambda j: j["state"] == "succeeded", timeout=BUILD_WITHIN)
    stdout, stderr = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, stderr
    assert _summary(stdout) == json.loads(job["result"]) and job["step"] == steps
    assert [p.name for p in faults.out.parent.iterdir()] == [faults.out.name]  # no temporary left
    assert load_cartridge(faults.out).rows == 16
    assert faults.worker.poll() is None  # still running, reconnecting to the broker


def test_a_cancel_during_synthesis_stops_after_the_batch_on_disk(faults):
    # The seeded 4, then six batches of 16: the cancel, sent after the first, must land while
    # synthesis still runs (with two batches the second could finish before it was read).
    watcher = faults.watch_build(steps=25)
    job = faults.wait_job(lambda j: j["conversations"] >= SEEDED + BATCH and j["step"] == 0)
    assert faults.cancel(job["id"]) == "requested"
    job = faults.wait_job(lambda j: j["state"] == "cancelled", timeout=CANCELLED_WITHIN)
    assert job["error"].startswith("cancelled on request: cancelled after ") and job["error"].endswith(
        " conversations"
    )
    assert job["step"] == 0
    _, stderr = watcher.communicate(timeout=60)
    assert watcher.returncode == 1 and "cancelled" in stderr
    faults.no_output_written()
    assert any(name.startswith(f"train-{SEEDED:06d}-") for name in faults.shards())


def test_a_cancel_during_training_stops_at_the_next_step(faults):
    # Steps to spare: the cancel is read before the next step, and a few short steps could all
    # be done before it was sent.
    watcher = faults.watch_build(steps=40)
    job = faults.wait_job(lambda j: j["state"] == "running" and j["step"] >= 1)
    assert faults.cancel(job["id"]) == "requested"
    job = faults.wait_job(lambda j: j["state"] == "cancelled", timeout=CANCELLED_WITHIN)
    assert job["error"].startswith("cancelled on request: cancelled after "), job["error"]
    assert job["error"].endswith(" of 40 steps") and 1 <= job["step"] < 40
    _, stderr = watcher.communicate(timeout=60)
    assert watcher.returncode == 1 and "cancelled" in stderr
    faults.no_output_written()
