"""`lmserve --fleet DIR`, live, through the OpenAI SDK: a real fleet (built by build_fleet on
SmolLM2 from the bench's made-up documents) picks each conversation's document by retrieval
through the model, names it in ``x-lmserve-documents``, keeps it for the conversation's
follow-ups with their cached rows, and never counts the cartridge rows as prompt tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.fleets.build import FleetBuildSpec, build_fleet
from inference.engine.engine import Engine
from tests.api.conftest import openai_client, start_lmserve
from tests.fixtures.model_files import default_model_path

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parents[2] / "bench" / "data" / "fleet" / "docs"
NAMES = ("aurelia-probe", "mirabel-bread", "ostmark-railway", "skyball-league")
QUESTIONS = {
    "aurelia-probe": "Tell me about the spacecraft that studies an ice moon with a radar.",
    "mirabel-bread": "How do I bake a sweet braided loaf with saffron and honey?",
}


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load(default_model_path())


@pytest.fixture(scope="module")
def fleet_server(tmp_path_factory, engine):
    root = tmp_path_factory.mktemp("fleet-live")
    (root / "docs").mkdir()
    for name in NAMES:
        (root / "docs" / f"{name}.txt").write_text((DOCS / f"{name}.txt").read_text())
    build_fleet(FleetBuildSpec(root / "docs", root / "fleet", engine.path, 32, 0, 256), engine=engine)
    flags = ["--fleet", str(root / "fleet"), "--rag-docs", "1", "--kv-slots", "2", "--ctx", "1024"]
    (root / "logs").mkdir()
    proc = start_lmserve(root / "logs", *flags)
    yield proc
    proc.stop()


def _ask(server, messages: list[dict]):
    with openai_client(server, timeout=600) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=messages, temperature=0, max_tokens=8
        )
    return raw.parse(), raw.headers.get("x-lmserve-documents")


def test_each_conversation_runs_behind_its_retrieved_document(fleet_server, engine):
    for name, question in QUESTIONS.items():
        messages = [{"role": "user", "content": question}]
        reply, documents = _ask(fleet_server, messages)
        assert documents == name
        assert reply.usage.prompt_tokens == len(engine.encode_chat(messages))  # no prefix rows


def test_a_follow_up_keeps_its_document_and_its_cached_rows(fleet_server):
    first = [{"role": "user", "content": QUESTIONS["mirabel-bread"]}]
    reply, documents = _ask(fleet_server, first)
    follow_up = [
        *first,
        {"role": "assistant", "content": reply.choices[0].message.content},
        {"role": "user", "content": "And how long does it rise?"},  # no topic words of its own
    ]
    again, documents_again = _ask(fleet_server, follow_up)
    assert documents_again == documents == "mirabel-bread"
    assert again.usage.prompt_tokens_details.cached_tokens > 0
