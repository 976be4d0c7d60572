"""`lmserve --fleet DIR`, live, when a document's file lies: a cartridge that stops reading as
one after start-up (cut in half on disk while the server runs) is skipped with one log line and
the reply is composed from the other documents, in both dialects, never a 500. (A bad file at
start-up is refused before anything is served: tests/fleet/test_fleet_flags.py.)

A synthetic llama serves, so the fleet builds in a second; retrieval is not what is tested: with
``--rag-docs`` as large as the fleet every conversation selects every document.
"""

from __future__ import annotations

import pytest

from fleet.fleets.build import FleetBuildSpec, build_fleet
from inference.engine.engine import Engine
from tests.api.conftest import anthropic_client, openai_client, start_lmserve
from tests.fixtures.synthetic_gguf import synthetic_path

pytestmark = pytest.mark.slow

DOCS = {
    "north": "All about the north pole, its ice and its winds.",
    "south": "All about the south pole, its penguins and its long nights.",
    "west": "All about the western sea, its currents and its islands.",
}
ASK = [{"role": "user", "content": "Tell me about the poles."}]


@pytest.fixture(scope="module")
def fleet_server(tmp_path_factory, synthetic_dir):
    llama = synthetic_path("llama", synthetic_dir)
    root = tmp_path_factory.mktemp("fleet-files-live")
    (root / "docs").mkdir()
    for name, text in DOCS.items():
        (root / "docs" / f"{name}.txt").write_text(text, encoding="utf-8")
    build_fleet(FleetBuildSpec(root / "docs", root / "fleet", llama, 32, 0, 64), engine=Engine.load(llama))
    (root / "logs").mkdir()
    flags = ["--fleet", str(root / "fleet"), "--rag-docs", "3", "--ctx", "512"]
    proc = start_lmserve(root / "logs", str(llama), *flags)
    proc.fleet = root / "fleet"
    yield proc
    proc.stop()


def documents(raw) -> list[str]:
    """The documents a reply names, sorted (the selection's order is retrieval's)."""
    return sorted(raw.headers["x-lmserve-documents"].split(","))


def test_a_document_cut_on_disk_while_serving_is_skipped_in_every_dialect(fleet_server):
    doc = fleet_server.fleet / "doc-002.safetensors"  # west's cartridge, not read since start-up
    doc.write_bytes(doc.read_bytes()[: doc.stat().st_size // 2])
    with openai_client(fleet_server, timeout=600) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=ASK, max_tokens=4, temperature=0
        )
    assert raw.status_code == 200 and documents(raw) == ["north", "south"]
    assert raw.parse().choices[0].finish_reason in ("stop", "length")
    with anthropic_client(fleet_server, timeout=600) as claude:
        user = [{"role": "user", "content": "And the western sea?"}]  # another conversation
        raw = claude.messages.with_raw_response.create(model="m", messages=user, max_tokens=4)
    assert raw.status_code == 200 and documents(raw) == ["north", "south"]
    assert raw.parse().stop_reason in ("end_turn", "max_tokens")
    logs = fleet_server.logs()
    assert logs.count("skipping it until the server restarts") == 1
    assert f"document 'west': {doc}: not a safetensors file" in logs
    assert " 500 " not in logs
