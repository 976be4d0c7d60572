"""The self-study dataset on disk: what is written reads back bit for bit, an interrupted write
resumes to exactly what an uninterrupted one writes, shards from two writers merge, and shards
of another dataset are refused by name."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from fleet.cartridges.build import corpus_tokens
from fleet.cartridges.dataset import DatasetHeader, load_split, shard_path, stored_settings, write_shard
from fleet.cartridges.selfstudy import SelfStudyConfig, synthesize_many
from inference.engine.engine import Engine
from tests.fixtures.synthetic_gguf import synthetic_path

CORPUS = (
    "Mira Okafor keeps bees on the roof of the Halden library: 9 hives, 3 of them painted yellow. "
    "She harvests in late August and sells the honey at the Saturday market for 7 coins a jar. "
) * 2
CONFIG = SelfStudyConfig(span_min=40, span_max=48, max_question=6, max_answer=8)


@pytest.fixture(scope="module")
def engine(synthetic_dir):
    return Engine.load(synthetic_path("llama", synthetic_dir))


@pytest.fixture(scope="module")
def tokens(engine, tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(CORPUS)
    return corpus_tokens(engine, path)


@pytest.fixture(scope="module")
def header(engine, tokens):
    return DatasetHeader.describe(engine, tokens, seed=2, config=CONFIG)


class Interrupt(Exception):
    pass


def test_written_conversations_read_back_exactly(engine, tokens, header, tmp_path):
    write_shard(engine, tokens, tmp_path, header, "train", 0, 3, batch=2)
    loaded = load_split(tmp_path, header, "train")
    made = synthesize_many(engine, tokens, seed=2, count=3, config=CONFIG)
    assert sorted(loaded) == [0, 1, 2]
    for i, conv in enumerate(made):
        got = loaded[i]
        assert (got.question, got.prompt, got.answer, got.span) == (
            conv.question,
            conv.prompt,
            conv.answer,
            conv.span,
        )
        assert np.array_equal(got.targets.ids, conv.targets.ids) and got.targets.ids.dtype == np.int64
        assert np.array_equal(got.targets.probs, conv.targets.probs) and got.targets.probs.dtype == np.float32
    held = write_shard(engine, tokens, tmp_path, header, "held_out", 0, 1)
    assert load_split(tmp_path, header, "held_out")[0].question != loaded[0].question and held.exists()


def test_an_interrupted_write_resumes_to_the_uninterrupted_file(engine, tokens, header, tmp_path):
    whole = write_shard(engine, tokens, tmp_path / "whole", header, "train", 0, 5, batch=2)
    seen = []

    def stop_after_first(n):
        seen.append(n)
        raise Interrupt

    with pytest.raises(Interrupt):
        write_shard(
            engine, tokens, tmp_path / "cut", header, "train", 0, 5, batch=2, on_batch=stop_after_first
        )
    cut = shard_path(tmp_path / "cut", "train", 0, 5)
    with cut.open("a") as f:
        f.write('{"index": 2, "seed_type": "que')  # the torn line a killed writer leaves
    assert sorted(load_split(tmp_path / "cut", header, "train")) == [0, 1]
    batches = []
    write_shard(engine, tokens, tmp_path / "cut", header, "train", 0, 5, batch=2, on_batch=batches.append)
    assert seen == [2] and batches == [2, 1]  # only the missing three were made
    assert cut.read_bytes() == whole.read_bytes()


def test_shards_from_two_writers_merge_into_one_dataset(engine, tokens, header, tmp_path):
    write_shard(engine, tokens, tmp_path / "one", header, "train", 0, 4)
    write_shard(engine, tokens, tmp_path / "a", header, "train", 0, 2)
    write_shard(engine, tokens, tmp_path / "b", header, "train", 1, 3)  # overlaps a's index 1
    merged = tmp_path / "merged"
    merged.mkdir()
    for part in ("a", "b"):
        for shard in (tmp_path / part).iterdir():
            shutil.copy(shard, merged)
    one, both = load_split(tmp_path / "one", header, "train"), load_split(merged, header, "train")
    assert sorted(both) == [0, 1, 2, 3]
    assert all(one[i].answer == both[i].answer and one[i].question == both[i].question for i in one)


def test_a_shard_of_another_dataset_is_refused_by_field(engine, tokens, header, tmp_path):
    write_shard(engine, tokens, tmp_path, header, "train", 0, 1)
    other = DatasetHeader.describe(engine, tokens, seed=3, config=CONFIG)
    with pytest.raises(ValueError, match="its seed is 2, this dataset's is 3"):
        load_split(tmp_path, other, "train")
    with pytest.raises(ValueError, match="corpus_sha256"):
        load_split(tmp_path, DatasetHeader.describe(engine, tokens[:-1], seed=2, config=CONFIG), "train")
    shard_path(tmp_path, "train", 5, 6).write_text("not json\n")
    with pytest.raises(ValueError, match="train-000005-000006.jsonl: not a self-study shard"):
        load_split(tmp_path, header, "train")
    with pytest.raises(ValueError, match="split 'test'"):
        write_shard(engine, tokens, tmp_path, header, "test", 0, 1)


def test_a_dataset_tells_its_own_settings_from_its_first_header(engine, tokens, header, tmp_path):
    assert stored_settings(tmp_path / "absent") is None and stored_settings(tmp_path) is None
    shard_path(tmp_path, "train", 0, 1).write_bytes(b'{"format": "lmserve-sel')  # torn header: nothing yet
    assert stored_settings(tmp_path) is None
    write_shard(engine, tokens, tmp_path, header, "train", 4, 1)
    assert stored_settings(tmp_path) == CONFIG
