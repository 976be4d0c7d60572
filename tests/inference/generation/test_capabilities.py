"""A backend's capabilities are what it does: ``batch`` holds exactly when a lockstep step is one
pass over the weights (the fused forward) and not a loop over the conversations, and a flag
the loaded model cannot honour is refused by name when the worker builds its backend."""

from __future__ import annotations

import dataclasses

import pytest

from inference.engine.engine import BatchRow, Engine
from inference.generation.backends import BackendSetup, backend_for
from inference.generation.capabilities import CAPABILITY_NAMES, Capabilities
from inference.runtime.service import InferenceService, ServeConfig
from tests.fixtures.model_files import default_model_path
from tests.fixtures.synthetic_gemma4 import gemma4_path


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load(default_model_path())


def numpy_passes(engine: Engine, monkeypatch) -> int:
    """How many times one lockstep step over two conversations runs the numpy layers."""
    calls = []
    layers = engine.model.forward_layers
    monkeypatch.setattr(engine.model, "forward_layers", lambda *a, **k: calls.append(1) or layers(*a, **k))
    rows = [BatchRow(engine.new_cache(16), token) for token in (1, 2)]
    engine.decode_batch(rows)
    return len(calls)


def test_batch_is_reported_where_a_step_is_one_weight_pass(engine, monkeypatch):
    backend = backend_for(BackendSetup(engine, n_ctx=64, kv_slots=2, batch=2))
    assert backend.capabilities.batch and numpy_passes(engine, monkeypatch) == 0  # the fused forward


def test_weights_without_a_fused_forward_report_no_batch_and_refuse_it(engine, monkeypatch):
    # A file whose matrices have no fused kernel loads with fused None: the numpy layers serve it.
    monkeypatch.setattr(engine.model, "fused", None)
    backend = backend_for(BackendSetup(engine, n_ctx=64))
    assert not backend.capabilities.batch and numpy_passes(engine, monkeypatch) == 2
    with pytest.raises(ValueError, match="^--batch 2 is not supported for the llama family: its forward"):
        backend_for(BackendSetup(engine, n_ctx=64, kv_slots=2, batch=2))


@pytest.mark.slow  # several seconds on a model: the slow tier (the fast one keeps under 5 minutes)
def test_a_numpy_path_family_reports_what_its_lockstep_step_does(synthetic_dir, monkeypatch):
    gemma4 = Engine.load(gemma4_path("gemma4", synthetic_dir))
    backend = backend_for(BackendSetup(gemma4, n_ctx=64))
    assert not backend.capabilities.batch and numpy_passes(gemma4, monkeypatch) == 2
    assert backend.capabilities.spec and backend.capabilities.kv_reuse  # its KV rows cut back


def test_the_service_reports_the_loaded_backends_capabilities(engine, monkeypatch):
    service = InferenceService(ServeConfig(), default_model_path())
    assert service.features() is None
    assert service.capabilities() == {**dict.fromkeys(CAPABILITY_NAMES, False), "ctx": None, "kv_slots": 0}
    backend = backend_for(BackendSetup(engine, n_ctx=64, kv_slots=2))
    service.worker.backend = backend
    reported = service.capabilities()
    assert reported == {**dataclasses.asdict(backend.capabilities), "ctx": 64, "kv_slots": 2}
    # The service answers from the same object: no embeddings means a 400, whatever the engine.
    monkeypatch.setattr(backend, "capabilities", dataclasses.replace(backend.capabilities, embeddings=False))
    assert service.embeddings_unavailable().status == 400
    assert service.features()["embeddings"] is False
    assert isinstance(backend.capabilities, Capabilities)
