"""``manage.py synthesize_selfstudy``: a dataset written in shards (in this process or by Celery
workers) is bit for bit the one a single write makes, a rerun resumes without a change, --first
extends it, and bad input (a dataset of another seed among it) is refused by name."""

from __future__ import annotations

import io
import json
import re
from dataclasses import asdict

import numpy as np
import pytest
from django.core.management import CommandError, call_command

from fleet.cartridges.build import BuildCancelled, SilentProgress, corpus_tokens
from fleet.cartridges.dataset import DatasetHeader, load_split, shard_path, write_shard
from fleet.cartridges.selfstudy import Conversation, SelfStudyConfig
from fleet.cartridges.synthesis_task import ShardJob, synthesize_shard
from fleet.services.selfstudy import SynthesisSpec, shard_ranges, synthesize_dataset
from inference.engine.engine import Engine
from tests.fixtures.synthetic_gguf import synthetic_path

CORPUS = (
    "Mira Okafor keeps bees on the roof of the Halden library: 9 hives, 3 of them painted yellow. "
    "She harvests in late August and sells the honey at the Saturday market for 7 coins a jar. "
) * 2
CONFIG = SelfStudyConfig(max_question=8, max_answer=8)  # short replies keep the synthesis fast
SMALL = ["--max-question", "8", "--max-answer", "8"]


@pytest.fixture(scope="module")
def model(synthetic_dir):
    return synthetic_path("llama", synthetic_dir)


@pytest.fixture(scope="module")
def engine(model):
    return Engine.load(model)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "bees.txt"
    path.write_text(CORPUS)
    return path


@pytest.fixture(scope="module")
def tokens(engine, corpus):
    return corpus_tokens(engine, corpus)


@pytest.fixture(scope="module")
def header(engine, tokens):
    return DatasetHeader.describe(engine, tokens, seed=0, config=CONFIG)


def synthesize(corpus, dataset, model, *args: str) -> dict:
    """The command in this process; its last stdout line's JSON."""
    out = io.StringIO()
    call_command(
        "synthesize_selfstudy",
        str(corpus),
        "--dataset",
        str(dataset),
        "--model",
        str(model),
        *SMALL,
        *args,
        stdout=out,
        stderr=io.StringIO(),
    )
    return json.loads(out.getvalue().strip().splitlines()[-1])


def assert_same(got: dict[int, Conversation], want: dict[int, Conversation]) -> None:
    assert sorted(got) == sorted(want)
    for i, conv in want.items():
        mine = got[i]
        assert (mine.seed_type, mine.span, mine.question, mine.prompt, mine.answer) == (
            conv.seed_type,
            conv.span,
            conv.question,
            conv.prompt,
            conv.answer,
        )
        assert np.array_equal(mine.targets.ids, conv.targets.ids)
        assert mine.targets.probs.tobytes() == conv.targets.probs.tobytes()  # bitwise


def snapshot(directory) -> dict:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_shards_resume_and_extend_to_what_one_write_makes(engine, tokens, header, corpus, model, tmp_path):
    data, ref = tmp_path / "data", tmp_path / "ref"
    summary = synthesize(corpus, data, model, "--conversations", "6", "--shards", "2", "--held-out", "2")
    names = ["train-000000-000003.jsonl", "train-000003-000006.jsonl", "held_out-000000-000002.jsonl"]
    assert summary["shards"] == [str(data / n) for n in names]
    assert (summary["dataset"], summary["conversations"], summary["held_out"]) == (str(data), 6, 2)
    assert summary["made"] == 8 and summary["seconds"] > 0
    write_shard(engine, tokens, ref, header, "train", 0, 6)  # one shard, one batch
    write_shard(engine, tokens, ref, header, "held_out", 0, 2)
    assert_same(load_split(data, header, "train"), load_split(ref, header, "train"))
    assert_same(load_split(data, header, "held_out"), load_split(ref, header, "held_out"))

    before = snapshot(data)
    again = synthesize(corpus, data, model, "--conversations", "6", "--shards", "2", "--held-out", "2")
    assert again["made"] == 0 and again["shards"] == summary["shards"] and snapshot(data) == before
    # Cut into other ranges, the same conversations are found in the shards there: nothing is made.
    other = synthesize(corpus, data, model, "--conversations", "6", "--shards", "3")
    assert other["made"] == 0 and other["shards"] == [] and snapshot(data) == before

    more = synthesize(corpus, data, model, "--first", "6", "--conversations", "2")
    assert more["shards"] == [str(data / "train-000006-000008.jsonl")]
    assert (more["conversations"], more["held_out"], more["made"]) == (8, 2, 2)
    write_shard(engine, tokens, ref, header, "train", 6, 2)
    assert_same(load_split(data, header, "train"), load_split(ref, header, "train"))


def test_a_cancelled_synthesis_resumes_to_the_uninterrupted_dataset(
    engine, tokens, header, corpus, model, tmp_path
):
    class CancelAfterFirstBatch(SilentProgress):
        def __init__(self):
            self.steps: list[int] = []

        def on_step(self, step, total, loss):
            self.steps.append(step)

        def cancelled(self):
            return bool(self.steps)

    spec = SynthesisSpec(corpus, tmp_path / "cut", model, conversations=5, batch=2, selfstudy=CONFIG)
    with pytest.raises(BuildCancelled, match="cancelled after 2 of 5 conversations"):
        synthesize_dataset(spec, CancelAfterFirstBatch(), engine)
    assert sorted(load_split(tmp_path / "cut", header, "train")) == [0, 1]
    result = synthesize_dataset(spec, SilentProgress(), engine)
    assert (result.made, result.conversations) == (3, 5)
    whole = write_shard(engine, tokens, tmp_path / "whole", header, "train", 0, 5, batch=2)
    assert shard_path(tmp_path / "cut", "train", 0, 5).read_bytes() == whole.read_bytes()


def test_shard_ranges_are_contiguous_and_even():
    assert shard_ranges(6, 7, 3) == [(6, 8), (8, 10), (10, 13)]
    assert shard_ranges(0, 4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]


def test_bad_input_is_refused(corpus, model, tmp_path):
    def refused(match: str, *args: str, corpus_arg=corpus, dataset=tmp_path / "d") -> None:
        with pytest.raises(CommandError, match=match):
            synthesize(corpus_arg, dataset, model, *args)

    refused("no such corpus file", corpus_arg=tmp_path / "absent.txt")
    refused("--shards 0: between 1 and --conversations", "--shards", "0")
    refused(r"--shards 7: between 1 and --conversations \(6\)", "--conversations", "6", "--shards", "7")
    refused("--conversations 0", "--conversations", "0")
    refused("--max-question and --max-answer", "--max-answer", "0")
    (tmp_path / "file").write_text("x")
    refused("must be a directory", dataset=tmp_path / "file")
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    refused("the corpus is empty", corpus_arg=empty)
    assert not (tmp_path / "d").exists()  # nothing was started


def test_a_dataset_of_another_seed_or_settings_is_refused_by_shard_and_field(corpus, model, tmp_path):
    synthesize(corpus, tmp_path, model, "--conversations", "1")
    with pytest.raises(CommandError, match="train-000000-000001.jsonl: its seed is 0, this dataset's is 1"):
        synthesize(corpus, tmp_path, model, "--conversations", "2", "--seed", "1")
    with pytest.raises(CommandError, match="train-000000-000001.jsonl: its selfstudy is"):
        synthesize(corpus, tmp_path, model, "--conversations", "2", "--max-answer", "9")
    assert [p.name for p in tmp_path.iterdir()] == ["train-000000-000001.jsonl"]  # refused before writing


def test_a_worker_that_sees_another_corpus_refuses_its_shard(header, corpus, model, tmp_path):
    expect = {**asdict(header), "corpus_sha256": "0" * 64}
    job = ShardJob(str(model), str(corpus), str(tmp_path), 0, "train", 0, 1, 16, asdict(CONFIG), expect)
    with pytest.raises(ValueError, match="its corpus_sha256 is '[0-9a-f]{64}', the dataset's is '0000"):
        synthesize_shard(job.as_item())
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match="unknown shard job fields: extra"):
        synthesize_shard({**job.as_item(), "extra": 1})


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_celery_workers_write_the_conversations_this_process_does(
    celery_world, header, corpus, model, tmp_path
):
    args = ["--conversations", "6", "--shards", "2", "--held-out", "1", *SMALL]
    there, here = tmp_path / "celery", tmp_path / "here"
    done = celery_world.manage(
        "synthesize_selfstudy", str(corpus), "--dataset", str(there), "--model", str(model), *args, "--celery"
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["conversations"], summary["held_out"], summary["made"]) == (6, 1, 7)
    assert summary["shards"] == [
        str(there / n)
        for n in ("train-000000-000003.jsonl", "train-000003-000006.jsonl", "held_out-000000-000001.jsonl")
    ]
    # the shards were the workers' (one task each), not this command's
    assert (
        len(re.findall(r"Task fleet\.document_item\[[^]]+\] succeeded", celery_world.worker_log.read_text()))
        == 3
    )
    synthesize(corpus, here, model, "--conversations", "6", "--shards", "2", "--held-out", "1")
    for split in ("train", "held_out"):
        assert_same(load_split(there, header, split), load_split(here, header, split))
