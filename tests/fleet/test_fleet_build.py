"""Building a fleet (synthetic model): the directory format, the index, refusals, cancellation,
and the per-document function run by plain arguments as a Celery worker would."""

from __future__ import annotations

import importlib
import json
import math
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from fleet.cartridges.build import BuildCancelled, SilentProgress
from fleet.cartridges.file import load_cartridge
from fleet.cartridges.init import initial_cartridge
from fleet.fleets.build import FleetBuildSpec, build_fleet
from fleet.fleets.format import FleetFormatError, read_index, read_manifest
from inference.engine.embedding import embedding_tokens
from inference.engine.engine import Engine
from tests.fixtures.synthetic_gguf import synthetic_path

DOCS = {
    "alpine": "Marmots whistle across alpine meadows while glaciers retreat each summer. " * 3,
    "bakery": "Sourdough rises overnight; the baker folds the dough and bakes at dawn.",
    "chess": "The knight forks king and rook; white castles short and pushes the passed pawn. " * 2,
}


@pytest.fixture(scope="module")
def engine(synthetic_dir):
    return Engine.load(synthetic_path("llama", synthetic_dir))


@pytest.fixture
def docs_dir(tmp_path):
    directory = tmp_path / "docs"
    directory.mkdir()
    for name, text in DOCS.items():
        (directory / f"{name}.txt").write_text(text, encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def built(tmp_path_factory, engine):
    """One default build shared by the tests that only read it."""
    root = tmp_path_factory.mktemp("built")
    directory = root / "docs"
    directory.mkdir()
    for name, text in DOCS.items():
        (directory / f"{name}.txt").write_text(text, encoding="utf-8")
    return root, build_fleet(spec(directory, engine, root / "fleet"), engine=engine)


def spec(docs_dir, engine, out, **kw):
    return FleetBuildSpec(docs_dir, out, engine.path, **{"prefix_tokens": 8, "embed_chunk": 16, **kw})


def test_build_writes_manifest_index_and_one_initial_cartridge_per_document(built, engine):
    tmp_path, result = built
    out = tmp_path / "fleet"
    manifest = read_manifest(out)
    assert manifest.names() == ["alpine", "bakery", "chess"]
    assert (manifest.p, manifest.embed_chunk, manifest.embed_dim) == (8, 16, engine.config.n_embd)
    assert manifest.fingerprint == engine.fingerprint and manifest.model == engine.path.name
    tok = engine.tokenizer
    for i, doc in enumerate(manifest.documents):
        text = DOCS[doc.name]
        tokens = tok.encode(text, add_bos=tok.add_bos, parse_special=False)
        body = tok.encode(text, add_bos=False, parse_special=False)
        assert (doc.tokens, doc.rows, doc.steps) == (len(tokens), 8, 0)
        assert doc.chunks == math.ceil(len(body) / 16)
        cart = load_cartridge(out / doc.cartridge)
        expected = initial_cartridge(engine, tokens[:8])
        assert np.array_equal(cart.k, expected.k) and np.array_equal(cart.v, expected.v)
        assert cart.frozen_rows == 1 and cart.fingerprint == engine.fingerprint
        assert doc.cartridge == f"doc-{i:03d}.safetensors"
    index = read_index(out, manifest)
    assert len(index) == result.chunks == sum(d.chunks for d in manifest.documents)
    assert index.embeddings.shape == (len(index), engine.config.n_embd)
    assert np.allclose(np.linalg.norm(index.embeddings, axis=1), 1.0, atol=1e-5)
    assert list(index.chunk_doc) == [i for i, d in enumerate(manifest.documents) for _ in range(d.chunks)]
    assert (result.documents, result.steps) == (3, 0) and result.seconds > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs", "fleet"]  # no temporary left


def test_index_rows_are_the_contract_embeddings_centred(tmp_path, docs_dir, engine):
    out = tmp_path / "fleet"
    build_fleet(spec(docs_dir, engine, out, embed_chunk=1000), engine=engine)  # one chunk per document
    manifest = read_manifest(out)
    index = read_index(out, manifest)
    raw = np.stack(
        [engine.embed(embedding_tokens(engine.tokenizer, DOCS[name])) for name in manifest.names()]
    )
    centroid = raw.mean(axis=0)
    assert np.allclose(index.centroid, centroid, atol=1e-6)
    centred = (raw - centroid) / np.linalg.norm(raw - centroid, axis=1, keepdims=True)
    assert np.allclose(index.embeddings, centred, atol=1e-5)


def test_the_per_document_function_runs_on_plain_arguments_like_a_celery_task(tmp_path, built, engine):
    root = built[0]
    docs_dir = root / "docs"
    calls = []

    def json_mapper(fn_name, items):
        module, _, name = fn_name.rpartition(".")
        fn = getattr(importlib.import_module(module), name)
        calls.append(fn_name)
        return [json.loads(json.dumps(fn(json.loads(json.dumps(item))))) for item in items]

    build_fleet(spec(docs_dir, engine, tmp_path / "b"), engine=engine, mapper=json_mapper)
    assert calls == ["fleet.fleets.build.prepare_document"]
    a, b = read_manifest(root / "fleet"), read_manifest(tmp_path / "b")
    assert a == b
    assert np.array_equal(read_index(root / "fleet", a).embeddings, read_index(tmp_path / "b", b).embeddings)
    for doc in a.documents:
        ka = load_cartridge(root / "fleet" / doc.cartridge).k
        assert np.array_equal(ka, load_cartridge(tmp_path / "b" / doc.cartridge).k)


def test_a_short_document_gets_a_shorter_cartridge(tmp_path, docs_dir, engine):
    out = tmp_path / "fleet"
    build_fleet(spec(docs_dir, engine, out, prefix_tokens=64), engine=engine)
    bakery = read_manifest(out).documents[1]
    assert bakery.rows == bakery.tokens < 64 and load_cartridge(out / bakery.cartridge).rows == bakery.rows


class CancelAfter(SilentProgress):
    def __init__(self, steps):
        self.steps, self.seen = steps, 0

    def on_step(self, step, total, loss):
        self.seen = step

    def cancelled(self):
        return self.seen >= self.steps


def test_cancellation_leaves_nothing_behind(tmp_path, docs_dir, engine):
    with pytest.raises(BuildCancelled, match="1 of 3"):
        build_fleet(spec(docs_dir, engine, tmp_path / "fleet"), CancelAfter(1), engine=engine)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs"]


def test_bad_input_is_refused_before_any_work(tmp_path, docs_dir, engine):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("x")
    with pytest.raises(ValueError, match="already exists"):
        build_fleet(spec(docs_dir, engine, taken), engine=engine)
    with pytest.raises(ValueError, match="no such directory"):
        build_fleet(spec(tmp_path / "nowhere", engine, tmp_path / "f"), engine=engine)
    (docs_dir / "alpine.md").write_text("again")
    with pytest.raises(ValueError, match="share the document name.*alpine"):
        build_fleet(spec(docs_dir, engine, tmp_path / "f"), engine=engine)
    (docs_dir / "alpine.md").unlink()
    (docs_dir / "a,b.txt").write_text("comma")
    with pytest.raises(ValueError, match="commas"):
        build_fleet(spec(docs_dir, engine, tmp_path / "f"), engine=engine)
    (docs_dir / "a,b.txt").unlink()
    (docs_dir / "empty.txt").write_text("  \n")
    with pytest.raises(ValueError, match="empty.txt: the corpus is empty"):
        build_fleet(spec(docs_dir, engine, tmp_path / "f"), engine=engine)
    assert not (tmp_path / "f").exists()


@pytest.mark.slow  # several seconds on a model: the slow tier (the fast one keeps under 5 minutes)
def test_steps_train_every_cartridge_jointly_and_record_their_steps(tmp_path, docs_dir, engine, built):
    out = tmp_path / "f"
    result = build_fleet(spec(docs_dir, engine, out, steps=2, held_out=0), engine=engine)
    manifest = read_manifest(out)
    assert result.steps == 2 and manifest.steps == 2 and manifest.training["method"] == "joint"
    assert sum(doc.steps for doc in manifest.documents) >= 2  # every round steps its target at least
    assert all(doc.kept_step is None for doc in manifest.documents)  # nothing held out: the last
    trained_doc = next(doc for doc in manifest.documents if doc.steps > 0)
    a = load_cartridge(out / trained_doc.cartridge)
    b = load_cartridge(built[0] / "fleet" / trained_doc.cartridge)  # the same documents untrained
    assert not np.array_equal(a.k, b.k)  # training moved it from the initialisation
    assert not list(out.glob("*.adam"))  # the optimizer state stays with the build


@pytest.mark.slow  # a trained build on the default self-study lengths; test_fleet_train has the unit
def test_held_out_conversations_pick_each_cartridges_checkpoint(tmp_path, docs_dir, engine, built):
    out = tmp_path / "f"
    build_fleet(spec(docs_dir, engine, out, steps=2, held_out=2), engine=engine)
    manifest = read_manifest(out)
    assert manifest.training["held_out"] == 2
    for doc in manifest.documents:
        assert 0 <= doc.kept_step <= doc.steps and doc.held_out_loss <= doc.held_out_initial
        kept = load_cartridge(out / doc.cartridge).k
        untrained = load_cartridge(built[0] / "fleet" / doc.cartridge).k
        assert np.array_equal(kept, untrained) == (doc.kept_step == 0)
    assert not list(out.glob("*.adam"))


def test_unreadable_fleet_directories_are_named(tmp_path, docs_dir, built):
    with pytest.raises(FleetFormatError, match="no such fleet directory"):
        read_manifest(tmp_path / "missing")
    with pytest.raises(FleetFormatError, match="no fleet.json"):
        read_manifest(docs_dir)
    out = tmp_path / "fleet"
    shutil.copytree(built[0] / "fleet", out)
    manifest = read_manifest(out)
    index_path = out / "index.safetensors"
    tensors = load_file(str(index_path))
    tensors["chunk_doc"][0] = 7
    save_file(
        tensors,
        str(index_path),
        metadata={"format": "lmserve-fleet-index/1", "model_fingerprint": manifest.model_fingerprint},
    )
    with pytest.raises(FleetFormatError, match="does not list"):
        read_index(out, manifest)
    save_file(
        tensors, str(index_path), metadata={"format": "lmserve-fleet-index/1", "model_fingerprint": "00" * 16}
    )
    with pytest.raises(FleetFormatError, match="another model"):
        read_index(out, manifest)
    index_path.unlink()
    with pytest.raises(FleetFormatError, match="no retrieval index"):
        read_index(out, manifest)
    data = json.loads((out / "fleet.json").read_text())
    del data["embed_dim"]
    (out / "fleet.json").write_text(json.dumps(data))
    with pytest.raises(FleetFormatError, match="incomplete"):
        read_manifest(out)
    (out / "fleet.json").write_text('{"format": "something-else"}')
    with pytest.raises(FleetFormatError, match="not a fleet manifest"):
        read_manifest(out)


def test_documents_prepared_with_another_model_are_refused(tmp_path, docs_dir, engine):
    from fleet.fleets.build import prepare_document

    def foreign(fn_name, items):
        return [{**prepare_document(item), "fingerprint": "00" * 16} for item in items]

    with pytest.raises(ValueError, match="alpine was prepared with another model"):
        build_fleet(spec(docs_dir, engine, tmp_path / "f"), engine=engine, mapper=foreign)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs"]
