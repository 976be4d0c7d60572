"""A fleet on the real SmolLM2: retrieval by the model's own embeddings finds a document's
topic, the adaptive rule ignores a polite follow-up and follows a clear change of subject, and
the composed prefix is each picked document's initial cartridge in selection order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fleet.cartridges.file import load_cartridge
from fleet.fleets.build import FleetBuildSpec, build_fleet
from fleet.fleets.retrieval import try_query
from fleet.fleets.source import FleetSource
from inference.engine.engine import Engine
from inference.types import GenerationRequest, Message
from tests.fixtures.model_files import default_model_path

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parents[2] / "bench" / "data" / "fleet" / "docs"
NAMES = ("aurelia-probe", "mirabel-bread", "ostmark-railway", "skyball-league")


@pytest.fixture(scope="module")
def engine():
    return Engine.load(default_model_path())


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory, engine):
    root = tmp_path_factory.mktemp("fleet-smollm2")
    (root / "docs").mkdir()
    for name in NAMES:
        (root / "docs" / f"{name}.txt").write_text((DOCS / f"{name}.txt").read_text())
    build_fleet(FleetBuildSpec(root / "docs", root / "fleet", engine.path, 16, 0, 256), engine=engine)
    return root / "fleet"


def conversation(*user_turns: str) -> GenerationRequest:
    messages = []
    for i, text in enumerate(user_turns):
        if i:
            messages.append(Message("assistant", "I see."))
        messages.append(Message("user", text))
    return GenerationRequest(tuple(messages))


QUESTIONS = {
    "aurelia-probe": "Tell me about the spacecraft that studies an ice moon with a radar.",
    "mirabel-bread": "How do I bake a sweet braided loaf with saffron and honey?",
    "ostmark-railway": "Tell me about the narrow-gauge railway with the steam locomotive and the viaduct.",
    "skyball-league": "How is the sport played on trampolines scored?",
}


def test_each_topic_retrieves_its_document_first(fleet_dir, engine):
    source = FleetSource(fleet_dir, rag_docs=2, rag_chunks=8)
    source.check(engine)
    for name, question in QUESTIONS.items():
        choice = source.choose(engine, conversation(question))
        assert choice.documents[0] == name, (question, choice.documents)
        first = load_cartridge(fleet_dir / f"doc-{NAMES.index(name):03d}.safetensors")
        assert np.array_equal(choice.prefix.k[:, :, : first.rows], first.k)
    result = try_query(fleet_dir, engine, QUESTIONS["skyball-league"])
    assert result.documents[0] == "skyball-league"
    assert result.document_scores["skyball-league"] == max(result.document_scores.values())


def test_adaptive_ignores_small_talk_and_follows_a_change_of_subject(fleet_dir, engine):
    source = FleetSource(fleet_dir, rag_docs=1, rag_chunks=8, adaptive=True, margin=0.05)
    bread = QUESTIONS["mirabel-bread"]
    assert source.choose(engine, conversation(bread)).documents == ("mirabel-bread",)
    polite = source.choose(engine, conversation(bread, "Thanks, that makes sense."))
    assert polite.documents == ("mirabel-bread",) and source.switches == 0
    pivot = (DOCS / "ostmark-railway.txt").read_text()
    switched = source.choose(engine, conversation(bread, "Thanks, that makes sense.", pivot))
    assert switched.documents == ("ostmark-railway",) and source.switches == 1
