"""Retrieval and FleetSource against a real engine (a synthetic GGUF): selection by the index's
contract, sticky conversations, the adaptive rule, composition and the start-up checks."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest

from fleet.cartridges.file import Cartridge, load_cartridge, save_cartridge
from fleet.fleets.build import FleetBuildSpec, build_fleet
from fleet.fleets.format import FleetIndex
from fleet.fleets.retrieval import Retriever, centre, embed_text, query_text, should_switch, try_query
from fleet.fleets.source import QUERY_MAX_TOKENS, FleetSource
from inference.engine.engine import Engine
from inference.engine.prefix import PrefixMismatchError
from inference.types import GenerationRequest, Message
from tests.fixtures.synthetic_gguf import synthetic_path

# One chunk per document (embed_chunk is large): a document's whole text as the query embeds
# exactly like its chunk, so retrieval must rank it first with cosine 1.
DOCS = {
    "alpine": "Marmots whistle across alpine meadows while glaciers retreat each summer.",
    "bakery": "Sourdough rises overnight; the baker folds the dough and bakes at dawn.",
    "chess": "The knight forks king and rook; white castles short and pushes the passed pawn.",
    "dunes": "Wind sculpts the desert dunes and camels cross the salt flats at night.",
}


@pytest.fixture(scope="module")
def engine(synthetic_dir):
    return Engine.load(synthetic_path("llama", synthetic_dir))


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory, engine):
    root = tmp_path_factory.mktemp("fleet-source")
    (root / "docs").mkdir()
    for name, text in DOCS.items():
        (root / "docs" / f"{name}.txt").write_text(text, encoding="utf-8")
    build_fleet(FleetBuildSpec(root / "docs", root / "fleet", engine.path, 6, 0, 1000), engine=engine)
    return root / "fleet"


def ask(*turns: str) -> GenerationRequest:
    """A conversation: user, assistant, user, ... ending with a user turn."""
    roles = ["user", "assistant"]
    return GenerationRequest(tuple(Message(roles[i % 2], text) for i, text in enumerate(turns)))


def test_centring_and_top_k_dedupe_to_documents_in_best_chunk_order():
    rows = np.eye(4, dtype=np.float32)[[0, 0, 1, 2, 3]] + 0.1
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    embeddings, centroid = centre(rows)
    assert np.allclose(centroid, rows.mean(axis=0)) and np.allclose(np.linalg.norm(embeddings, axis=1), 1)
    retriever = Retriever(FleetIndex(embeddings, centroid, np.array([0, 0, 1, 2, 3])))
    query = rows[2] + 0.2 * rows[3]
    selection = retriever.select(query / np.linalg.norm(query), rag_chunks=3, rag_docs=2)
    assert selection.documents == (1, 2)
    assert [h.chunk for h in selection.hits][:2] == [2, 3] and selection.hits[0].score > selection.hits[
        1
    ].score
    assert retriever.select(rows[0], rag_chunks=1, rag_docs=2).documents == (0,)  # k chunks bound the docs


def test_the_switch_rule_needs_an_outside_document_to_win_by_the_margin():
    best = np.array([0.50, 0.30, 0.56, 0.54], np.float32)
    assert should_switch(best, (0, 1), margin=0.05)  # 0.56 >= 0.50 + 0.05
    assert not should_switch(best, (0, 1), margin=0.07)
    assert not should_switch(best, (2, 3), margin=0.0)  # nothing outside beats 0.56
    assert not should_switch(best, (0, 1, 2, 3), margin=0.0)  # nothing outside at all


def test_each_document_retrieves_itself_and_the_prefix_is_its_cartridge(fleet_dir, engine):
    source = FleetSource(fleet_dir, rag_docs=2, rag_chunks=4)
    source.check(engine)
    for name, text in DOCS.items():
        choice = source.choose(engine, ask(text))
        assert choice.documents[0] == name and len(choice.documents) == 2
        assert choice.key == "fleet:" + ",".join(choice.documents)
        parts = [
            load_cartridge(fleet_dir / f"doc-{list(DOCS).index(d):03d}.safetensors") for d in choice.documents
        ]
        assert np.array_equal(choice.prefix.k, np.concatenate([p.k for p in parts], axis=2))
        assert np.array_equal(choice.prefix.v, np.concatenate([p.v for p in parts], axis=2))
        assert choice.prefix.rows == sum(p.rows for p in parts)
    assert source.retrievals == len(DOCS)
    result = try_query(fleet_dir, engine, DOCS["chess"], rag_chunks=4, rag_docs=2)
    assert result.documents[0] == "chess" and result.chunks[0].document == "chess"
    assert result.chunks[0].score == pytest.approx(1.0, abs=1e-4) and result.chunks[0].chunk == 0
    assert result.document_scores["chess"] == pytest.approx(1.0, abs=1e-4)
    assert [c.score for c in result.chunks] == sorted((c.score for c in result.chunks), reverse=True)


def test_selection_is_sticky_per_conversation_and_interleaving_keeps_them_apart(fleet_dir, engine):
    source = FleetSource(fleet_dir, rag_docs=1, rag_chunks=4)
    first = source.choose(engine, ask(DOCS["alpine"]))
    other = source.choose(engine, ask(DOCS["dunes"]))
    follow = source.choose(engine, ask(DOCS["alpine"], "Marmots.", DOCS["dunes"]))
    other_follow = source.choose(engine, ask(DOCS["dunes"], "Dunes.", DOCS["chess"]))
    assert (first.documents, other.documents) == (("alpine",), ("dunes",))
    assert follow.key == first.key and other_follow.key == other.key
    assert source.retrievals == 2  # follow-ups of remembered conversations run no retrieval


def test_adaptive_switches_only_past_the_margin(fleet_dir, engine):
    never = FleetSource(fleet_dir, rag_docs=1, rag_chunks=4, adaptive=True, margin=2.0)
    edge = FleetSource(fleet_dir, rag_docs=1, rag_chunks=4, adaptive=True, margin=0.0)
    for source in (never, edge):
        assert source.choose(engine, ask(DOCS["alpine"])).documents == ("alpine",)
    turns = (DOCS["alpine"], "ok", DOCS["chess"] + " " + DOCS["dunes"])
    assert never.choose(engine, ask(*turns)).documents == ("alpine",) and never.switches == 0
    adapted = edge.choose(engine, ask(*turns))
    assert never.retrievals == edge.retrievals == 2  # a follow-up re-embeds when adaptive
    query = embed_text(engine, query_text([turns[0], turns[2]]), QUERY_MAX_TOKENS)
    best = edge.retriever.document_best(query, len(DOCS))
    if should_switch(best, (0,), 0.0):
        expected = tuple(edge.names[d] for d in edge.retriever.select(query, 4, 1).documents)
    else:
        expected = ("alpine",)
    assert adapted.documents == expected and edge.switches == (expected != ("alpine",))
    assert (
        edge.choose(engine, ask(*turns, "ok", "more")).key == adapted.key
    )  # the new selection is remembered


def test_the_cartridge_lru_stays_small(fleet_dir, engine):
    source = FleetSource(fleet_dir, rag_docs=1, rag_chunks=1, resident=2)
    for text in DOCS.values():
        source.choose(engine, ask(text))
    assert len(source.cartridges) == 2 and list(source.cartridges) == [2, 3]


def test_serving_bytes_cover_what_the_caches_hold_once_full(fleet_dir, engine):
    # Every request composing two new documents fills both caches to capacity: what they hold
    # then is at most what the source reported for the KV RAM guard, and with documents of one
    # length exactly it.
    source = FleetSource(fleet_dir, rag_docs=2, rag_chunks=2, resident=3)
    texts = list(DOCS.values())
    for i in range(len(texts)):
        source.choose(engine, ask(texts[i] + " " + texts[(i + 1) % len(texts)]))
    held = [p for cache in (source.cartridges, source.compositions) for p in cache.values()]
    assert len(source.cartridges) == 3 and len(source.compositions) == 2
    rows = {doc.rows for doc in source.fleet.manifest.documents}
    assert rows == {6} and sum(p.k.nbytes + p.v.nbytes for p in held) == source.serving_bytes()


def test_a_fleet_for_another_model_is_refused_with_both_identities(fleet_dir, synthetic_dir):
    other_path = synthetic_path("qwen3", synthetic_dir)
    source = FleetSource(fleet_dir)
    with pytest.raises(PrefixMismatchError, match="built for another model.*fingerprint"):
        source.check_model_file(other_path)
    with pytest.raises(PrefixMismatchError, match="built for another model"):
        source.check(Engine.load(other_path))


def cartridge_file(fleet_dir, name: str):
    return fleet_dir / f"doc-{list(DOCS).index(name):03d}.safetensors"


@pytest.fixture
def own_fleet(fleet_dir, tmp_path):
    """A copy of the fleet that a test may damage."""
    return shutil.copytree(fleet_dir, tmp_path / "fleet")


def test_a_document_that_fails_to_read_while_serving_is_skipped_with_one_log_line(own_fleet, engine, caplog):
    source = FleetSource(own_fleet, rag_docs=2, rag_chunks=4)
    source.check(engine)
    path = cartridge_file(own_fleet, "chess")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # changed on disk after start-up
    with caplog.at_level(logging.WARNING, logger="lmserve.fleet"):
        choice = source.choose(engine, ask(DOCS["chess"]))
        again = source.choose(engine, ask(DOCS["chess"], "More.", DOCS["chess"]))  # its follow-up
        other = source.choose(engine, ask(DOCS["chess"] + " Again."))  # a new conversation
    (partner,) = choice.documents  # the reply is built from the rest of the selection
    assert partner != "chess" and again.key == choice.key == f"fleet:{partner}"
    assert np.array_equal(choice.prefix.k, load_cartridge(cartridge_file(own_fleet, partner)).k)
    assert "chess" not in other.documents and len(other.documents) == 2  # retrieval leaves it out
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"--fleet {own_fleet}: document 'chess': {path}: not a safetensors file")
    assert line.endswith("skipping it until the server restarts") and source.unreadable == {2}


def test_when_every_selected_document_fails_retrieval_picks_among_the_rest(own_fleet, engine):
    source = FleetSource(own_fleet, rag_docs=1, rag_chunks=4)
    source.check(engine)
    for name in ("chess", "alpine"):  # a valid cartridge, but of another row count than listed
        good = load_cartridge(cartridge_file(own_fleet, name))
        save_cartridge(
            cartridge_file(own_fleet, name), Cartridge(good.k[:, :, :2], good.v[:, :, :2], good.fingerprint)
        )
    choice = source.choose(engine, ask(DOCS["chess"]))
    assert choice.documents and choice.documents[0] not in ("chess", "alpine")
    for name in ("bakery", "dunes"):
        cartridge_file(own_fleet, name).unlink()
    source.cartridges.clear()  # and out of memory: evicted from the LRUs meanwhile
    source.compositions.clear()
    nothing = source.choose(engine, ask(DOCS["dunes"]))  # no document is left: no prefix at all
    assert (nothing.documents, nothing.prefix.rows, nothing.key) == ((), 0, "fleet:")
    assert source.unreadable == {0, 1, 2, 3}
    source.adaptive = True  # a follow-up of that conversation has nothing to adapt from either
    assert source.choose(engine, ask(DOCS["dunes"], "Hm.", DOCS["chess"])).key == "fleet:"


def test_a_fleet_whose_cartridges_fit_another_geometry_is_refused_once_the_model_loads(own_fleet, engine):
    for name in DOCS:  # the right model's fingerprint, twice the key heads: a forged fleet
        good = load_cartridge(cartridge_file(own_fleet, name))
        k, v = np.repeat(good.k, 2, axis=1), np.repeat(good.v, 2, axis=1)
        save_cartridge(cartridge_file(own_fleet, name), Cartridge(k, v, good.fingerprint, good.frozen_rows))
    source = FleetSource(own_fleet)  # consistent among themselves: only the model can tell
    with pytest.raises(
        PrefixMismatchError, match="its cartridges' KV geometry .* does not match the model's"
    ):
        source.check(engine)
