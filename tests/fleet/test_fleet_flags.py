"""``manage.py lmserve --fleet DIR --rag-*``: parsing and the start-up refusals (each before
anything is served or the database is touched), and the worker's check once the model loads."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from fleet.fleets.build import FleetBuildSpec, build_fleet
from fleet.fleets.source import FleetSource
from inference.engine.engine import Engine
from inference.runtime.queue import JobQueue
from inference.runtime.worker import FAILED, InferenceWorker
from tests.fixtures.synthetic_gguf import synthetic_path


@pytest.fixture(scope="module")
def llama(synthetic_dir):
    return synthetic_path("llama", synthetic_dir)


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory, llama):
    root = tmp_path_factory.mktemp("fleet-flags")
    (root / "docs").mkdir()
    for name in ("north", "south"):
        (root / "docs" / f"{name}.txt").write_text(f"All about the {name} pole, its ice and its winds.")
    build_fleet(FleetBuildSpec(root / "docs", root / "fleet", llama, 8, 0, 64), engine=Engine.load(llama))
    return root / "fleet"


def lmserve(*args):
    call_command("lmserve", *map(str, args))


def test_fleet_excludes_the_disk_tier(fleet_dir, llama, tmp_path):
    with pytest.raises(CommandError, match="--fleet excludes --kv-cache-dir"):
        lmserve(llama, "--fleet", fleet_dir, "--kv-cache-dir", tmp_path)


@pytest.mark.parametrize(
    "option, value, named", [("cartridge", "c.safetensors", "--cartridge"), ("batch", 2, "--batch > 1")]
)
def test_fleet_excludes_a_cartridge_and_batching(fleet_dir, llama, option, value, named):
    """--cartridge and --batch are other helpers' flags: the refusal reads their parsed options."""
    from inference.management.commands.lmserve import Command

    options = {"fleet": str(fleet_dir), "kv_cache_dir": None, option: value}
    with pytest.raises(CommandError, match=f"--fleet excludes {named}"):
        Command().fleet_source(options, llama)


def test_the_flags_open_the_fleet_with_its_knobs(fleet_dir, llama):
    from inference.management.commands.lmserve import Command

    parser = Command().create_parser("manage.py", "lmserve")
    options = vars(
        parser.parse_args(
            [
                str(llama),
                "--fleet",
                str(fleet_dir),
                "--rag-docs",
                "1",
                "--rag-chunks",
                "3",
                "--rag-adaptive",
                "--rag-margin",
                "0.1",
            ]
        )
    )
    source = Command().fleet_source(options, llama)
    assert isinstance(source, FleetSource)
    assert (source.rag_docs, source.rag_chunks, source.adaptive, source.margin) == (1, 3, True, 0.1)
    assert Command().fleet_source(vars(parser.parse_args([str(llama)])), llama) is None


def test_a_fleet_for_another_model_is_refused_at_start_up(fleet_dir, synthetic_dir):
    with pytest.raises(CommandError, match="built for another model"):
        lmserve(synthetic_path("qwen3", synthetic_dir), "--fleet", fleet_dir)


def test_a_directory_that_is_no_fleet_is_refused(tmp_path, llama):
    with pytest.raises(CommandError, match="no fleet.json"):
        lmserve(llama, "--fleet", tmp_path)


def test_the_context_must_hold_the_composed_prefix(fleet_dir, llama):
    with pytest.raises(CommandError, match="--ctx 16 leaves no room"):
        lmserve(llama, "--fleet", fleet_dir, "--ctx", "16", "--rag-docs", "2")


@pytest.mark.parametrize(
    "flag, value", [("--rag-docs", "0"), ("--rag-chunks", "-1"), ("--rag-margin", "-0.1")]
)
def test_bad_knobs_are_refused_by_the_parser(fleet_dir, llama, flag, value):
    with pytest.raises(CommandError, match=flag.lstrip("-")):
        lmserve(llama, "--fleet", fleet_dir, flag, value)


def test_the_worker_refuses_a_foreign_fleet_once_the_model_loads(fleet_dir, synthetic_dir):
    worker = InferenceWorker(
        synthetic_path("qwen3", synthetic_dir), JobQueue(1), 256, prefix_source=FleetSource(fleet_dir)
    )
    worker.start()
    assert worker.join(120)
    assert worker.state == FAILED and "built for another model" in worker.error


def test_the_command_line_refuses_a_foreign_fleet_with_its_message_and_status(fleet_dir, synthetic_dir):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    other = synthetic_path("qwen3", synthetic_dir)
    command = [sys.executable, str(root / "manage.py"), "lmserve", str(other), "--fleet", str(fleet_dir)]
    run = subprocess.run(
        [*command, "--port", "0"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1 and "built for another model" in run.stderr
    assert "serving" not in run.stdout
