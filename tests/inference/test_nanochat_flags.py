"""``manage.py lmserve --nanochat DIR``: the refusals at start-up (each before anything is
served or the database is touched), and the worker's load of a directory it cannot serve."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from inference.runtime.queue import JobQueue
from inference.runtime.worker import FAILED, READY, InferenceWorker
from tests.fixtures.synthetic_nanochat import write_nanochat_checkpoint


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    return write_nanochat_checkpoint(tmp_path_factory.mktemp("nanochat-flags") / "ck")


def lmserve(*args):
    call_command("lmserve", *map(str, args))


def test_a_model_argument_is_refused(checkpoint_dir):
    with pytest.raises(
        CommandError, match="--nanochat excludes a MODEL argument: --nanochat DIR is the model"
    ):
        lmserve("some.gguf", "--nanochat", checkpoint_dir)


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--spec"], "--spec"),
        (["--batch", "2"], "--batch > 1"),
        (["--kv-slots", "3"], "--kv-slots > 1"),
        (["--cartridge", "c.safetensors"], "--cartridge"),
    ],
)
def test_flags_it_cannot_honour_are_refused(checkpoint_dir, flags, named):
    with pytest.raises(CommandError, match=f"--nanochat excludes {named}: nanochat"):
        lmserve("--nanochat", checkpoint_dir, *flags)


def test_a_directory_without_the_files_is_refused(tmp_path):
    with pytest.raises(CommandError, match="no model.safetensors"):
        lmserve("--nanochat", tmp_path)
    with pytest.raises(CommandError, match="not a directory"):
        lmserve("--nanochat", tmp_path / "missing")


def test_the_worker_loads_the_checkpoint_or_fails_naming_it(checkpoint_dir, tmp_path):
    worker = InferenceWorker(checkpoint_dir, JobQueue(4), n_ctx=128, nanochat=True)
    assert worker._load() and worker.state == READY
    assert worker.backend.capabilities.kv_reuse is False and worker.backend.n_ctx == 128
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    (tmp_path / "tokenizer.bin").write_bytes((checkpoint_dir / "tokenizer.bin").read_bytes())
    broken = InferenceWorker(tmp_path, JobQueue(4), n_ctx=128, nanochat=True)
    assert not broken._load() and broken.state == FAILED
    assert "unreadable safetensors header" in broken.error
