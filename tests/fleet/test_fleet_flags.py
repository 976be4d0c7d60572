"""``manage.py lmserve --fleet DIR --rag-*``: parsing and the start-up refusals (each before
anything is served or the database is touched: a bad document among them, named), and the
worker's check once the model loads."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from django.core.management import CommandError, call_command

from fleet.cartridges.file import Cartridge, load_cartridge, save_cartridge
from fleet.cartridges.init import initial_cartridge
from fleet.fleets.build import FleetBuildSpec, build_fleet
from fleet.fleets.source import FleetSource
from inference.engine.engine import Engine
from inference.kv.ram_guard import MIB
from inference.runtime.queue import JobQueue
from inference.runtime.worker import FAILED, READY, InferenceWorker
from tests.fixtures.synthetic_gguf import synthetic_path


@pytest.fixture(scope="module")
def llama(synthetic_dir):
    return synthetic_path("llama", synthetic_dir)


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory, llama):
    root = tmp_path_factory.mktemp("fleet-flags")
    (root / "docs").mkdir()
    for name in ("north", "south", "west"):
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
    from api.management.commands.lmserve import Command

    options = {"fleet": str(fleet_dir), "kv_cache_dir": None, option: value}
    with pytest.raises(CommandError, match=f"--fleet excludes {named}"):
        Command().fleet_source(options, llama)


def test_the_flags_open_the_fleet_with_its_knobs(fleet_dir, llama):
    from api.management.commands.lmserve import Command

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


def test_the_kv_ram_guard_sets_aside_what_the_fleet_will_hold(fleet_dir, llama, caplog):
    source = FleetSource(fleet_dir, rag_docs=2)
    worker = InferenceWorker(llama, JobQueue(1), 256, prefix_source=source)
    with caplog.at_level(logging.INFO, logger="lmserve.worker"):
        assert worker._load() and worker.state == READY
    assert source.serving_bytes() > 0
    assert f"less {source.serving_bytes() / MIB:.1f} MiB kept for serving" in caplog.text


def test_the_worker_refuses_a_foreign_fleet_once_the_model_loads(fleet_dir, synthetic_dir):
    worker = InferenceWorker(
        synthetic_path("qwen3", synthetic_dir), JobQueue(1), 256, prefix_source=FleetSource(fleet_dir)
    )
    worker.start()
    assert worker.join(120)
    assert worker.state == FAILED and "built for another model" in worker.error


def test_the_command_line_refuses_a_foreign_fleet_with_its_message_and_status(fleet_dir, synthetic_dir):
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


# -- a bad document is refused at start-up, by name ---------------------------------------------
def poison(path: Path, count: int = 400) -> None:
    """Overwrite ``count`` bytes of the file's tensor data with 0xFF: float32 NaNs."""
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")  # past the safetensors header
    data[start : start + count] = b"\xff" * count
    path.write_bytes(bytes(data))


def another_models_cartridge(path: Path, synthetic_dir) -> None:
    save_cartridge(path, initial_cartridge(Engine.load(synthetic_path("qwen3", synthetic_dir)), [5, 6, 7]))


def other_rows(path: Path, _) -> None:
    good = load_cartridge(path)
    save_cartridge(path, Cartridge(good.k[:, :, :-1], good.v[:, :, :-1], good.fingerprint))


def other_geometry(path: Path, _) -> None:
    good = load_cartridge(path)  # the right model's fingerprint, twice the key heads
    save_cartridge(
        path, Cartridge(np.repeat(good.k, 2, axis=1), np.repeat(good.v, 2, axis=1), good.fingerprint)
    )


def cut_in_half(path: Path, _) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


BAD_DOCUMENTS = {
    "another model": (another_models_cartridge, "built for the model with fingerprint"),
    "cut in half": (cut_in_half, "not a safetensors file"),
    "NaN rows": (lambda path, _: poison(path), "100 non-finite values (NaN or infinity) in layers.0."),
    "missing": (lambda path, _: path.unlink(), "no such cartridge file"),
    "other rows": (other_rows, "rows, the manifest says"),
    "other geometry": (other_geometry, "KV geometry"),
}


@pytest.mark.parametrize("damage", list(BAD_DOCUMENTS))
def test_a_bad_document_is_refused_at_start_up_naming_it(fleet_dir, llama, synthetic_dir, tmp_path, damage):
    """Any document, not only the first: the last one (west, doc-002) here."""
    spoil, needle = BAD_DOCUMENTS[damage]
    fleet = Path(shutil.copytree(fleet_dir, tmp_path / "fleet"))
    spoil(fleet / "doc-002.safetensors", synthetic_dir)
    with pytest.raises(CommandError) as refused:
        lmserve(llama, "--fleet", fleet, "--rag-docs", "3")
    message = str(refused.value)
    assert message.startswith(f"--fleet {fleet}: document 'west': ")
    assert f"{fleet / 'doc-002.safetensors'}: " in message and needle in message


def test_the_command_line_refuses_a_bad_document_with_its_name_and_status(
    fleet_dir, llama, synthetic_dir, tmp_path
):
    fleet = Path(shutil.copytree(fleet_dir, tmp_path / "fleet"))
    another_models_cartridge(fleet / "doc-002.safetensors", synthetic_dir)
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [
            sys.executable,
            str(root / "manage.py"),
            "lmserve",
            str(llama),
            "--fleet",
            str(fleet),
            "--port",
            "0",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1 and "serving" not in run.stdout
    assert f"{fleet / 'doc-002.safetensors'}: built for the model with fingerprint" in run.stderr
