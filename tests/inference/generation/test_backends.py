"""The backend seam: the loaded family names its generation loop, chosen in one place."""

from __future__ import annotations

import dataclasses
import time

import pytest

from inference.engine.engine import Engine
from inference.engine.families import StateKind
from inference.generation import backends
from inference.generation.backend import ConversationBackend
from inference.generation.backends import BackendSetup, backend_for
from inference.runtime.queue import JobQueue
from inference.runtime.worker import READY, InferenceWorker
from inference.types import GenerationRequest
from tests.fixtures.model_files import default_model_path
from tests.inference.generation.test_backend import FRANCE, GREEDY, run


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load(default_model_path())


def with_family(engine: Engine, **changes) -> Engine:
    family = dataclasses.replace(engine.family, **changes)
    return Engine(engine.path, engine.file, engine.model, engine.tokenizer, family)


def test_the_generic_backend_serves_the_default_family(engine):
    backend = backend_for(BackendSetup(engine, n_ctx=128))
    assert isinstance(backend, ConversationBackend)
    assert backend.capabilities.kv_reuse and backend.slots is not None


def test_a_family_naming_an_unknown_backend_is_a_clear_error(engine, monkeypatch):
    monkeypatch.delitem(backends.BACKENDS, "conversation")
    with pytest.raises(
        ValueError, match="'llama' names generation backend 'conversation'.*known: diffusion, nanochat"
    ):
        backend_for(BackendSetup(engine, n_ctx=128))


class RecurrentBackend(ConversationBackend):
    """A family's own loop, registered beside the generic one."""


def test_the_worker_loads_the_backend_the_family_names(engine, monkeypatch, tmp_path, caplog):
    caplog.set_level("INFO", logger="lmserve.worker")
    monkeypatch.setitem(
        backends.BACKENDS, "recurrent", lambda setup: RecurrentBackend(setup.engine, setup.n_ctx)
    )
    monkeypatch.setattr(
        Engine,
        "load",
        classmethod(lambda cls, path, options=None: with_family(engine, state=StateKind.RECURRENT)),
    )
    queue = JobQueue(2)
    failures: list[str] = []
    worker = InferenceWorker(default_model_path(), queue, n_ctx=128, on_failure=failures.append)
    worker.start()
    # The warm-up compiles every kernel on a cold numba cache: minutes on a loaded 2-core machine.
    # A failed load never sets ``ready``, so the wait also ends when one is reported.
    deadline = time.monotonic() + 900
    while not worker.ready.wait(0.5) and not failures and time.monotonic() < deadline:
        pass
    assert worker.state == READY, failures
    queue.close()
    assert worker.join(30)
    assert isinstance(worker.backend, RecurrentBackend) and not worker.backend.capabilities.kv_reuse
    # Before the warm-up the log says whether it compiles the kernels or loads them.
    assert any("the engine's" in r.getMessage() and "kernels" in r.getMessage() for r in caplog.records)


def test_a_family_without_kv_reuse_never_starts_from_cached_rows(engine):
    backend = ConversationBackend(with_family(engine, state=StateKind.ROLLING), n_ctx=128)
    request = GenerationRequest(FRANCE, GREEDY, max_tokens=4)
    first, _ = run(backend, request)
    again, _ = run(backend, request)
    assert not backend.capabilities.kv_reuse and again.events[-1].usage.cached_tokens == 0
    assert again.text == first.text
