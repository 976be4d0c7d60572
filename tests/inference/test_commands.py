"""The management commands users run by hand: generate and fetch_models."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError

from inference.engine.jit.numba_cache import BASE_VARIABLE
from inference.management.commands.fetch_models import assemble
from inference.model_files import ChunkedModel, ModelFileError, resolve_model

ROOT = Path(__file__).resolve().parents[2]
STATS_LINE = re.compile(r"^prefill: (\d+) tokens, [\d.]+ tok/s; decode: (\d+) tokens, [\d.]+ tok/s$")


def generate(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "manage.py", "generate", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800, env=env)


@pytest.mark.slow  # a manage.py process loading the model
def test_generate_streams_only_text_and_ends_stderr_with_the_stats_line():
    done = generate("--prompt", "The capital of France is", "--max-tokens", "8", "--ignore-eos")
    assert done.returncode == 0, done.stderr
    assert "Paris" in done.stdout
    match = STATS_LINE.match(done.stderr.strip().splitlines()[-1])
    assert match, done.stderr
    assert match.groups() == ("5", "8")  # "The capital of France is" is 5 tokens for SmolLM2


@pytest.mark.slow  # a manage.py process loading the model
@pytest.mark.slow  # a cold compile of every kernel: minutes on a busy machine
def test_generate_on_an_empty_kernel_cache_says_it_compiles_and_reports_progress(tmp_path):
    empty = str(tmp_path / "numba")
    env = {**os.environ, "NUMBA_CACHE_DIR": empty, BASE_VARIABLE: empty}
    done = generate("--prompt", "The capital of France is", "--max-tokens", "4", "--ignore-eos", env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith(f"compiling the engine's kernels for this CPU into {empty}"), done.stderr
    progress = re.compile(r"compiling kernels: \d+ done in \d+ s, now \S+")
    assert any(progress.match(line) for line in lines), done.stderr
    assert re.match(r"compiled \d+ kernels in \d+ s", lines[-2]), done.stderr
    assert STATS_LINE.match(lines[-1]), done.stderr  # the warm-up's lines come before it


def test_generate_chat_mode_wraps_the_prompt_and_stops_at_end_of_turn():
    done = generate("--chat", "--prompt", "Name the capital city of France.", "--max-tokens", "40")
    assert done.returncode == 0, done.stderr
    assert "Paris" in done.stdout and "<|im_end|>" not in done.stdout
    prefill, decoded = STATS_LINE.match(done.stderr.strip().splitlines()[-1]).groups()
    assert int(prefill) > 20 and 0 < int(decoded) < 40


@pytest.mark.slow  # a manage.py process loading the model
def test_generate_sampling_is_reproducible_with_a_seed():
    args = ("--prompt", "Once upon a time", "--max-tokens", "12", "--temperature", "0.9", "--seed", "7")
    first, second = generate(*args), generate(*args)
    assert first.returncode == 0 and first.stdout == second.stdout


@pytest.mark.slow  # a manage.py process loading the model
def test_generate_rejects_bad_input_with_a_clear_message(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"nope")
    done = generate(str(bad), "--prompt", "hi")
    assert done.returncode != 0 and "not a GGUF file" in done.stderr
    done = generate("--prompt", "hi", "--max-tokens", "0")
    assert done.returncode != 0 and "--max-tokens must be at least 1" in done.stderr


@pytest.mark.slow  # manage.py processes loading the model
def test_generate_behind_a_cartridge_equals_the_text_in_the_prompt(tmp_path):
    from fleet.cartridges.file import Cartridge, save_cartridge
    from fleet.cartridges.init import initial_cartridge
    from inference.engine.engine import Engine
    from inference.model_files import default_model_path

    engine = Engine.load(default_model_path())
    text, prompt = "The secret code is 4821.", " The secret code is"
    head = engine.encode_prompt(text)
    assert engine.encode_prompt(text + prompt) == head + engine.encode_prompt(prompt)  # a clean cut
    cartridge = initial_cartridge(engine, head)
    path = save_cartridge(tmp_path / "secret.safetensors", cartridge)
    behind = generate("--prompt", prompt, "--cartridge", str(path), "--max-tokens", "6", "--ignore-eos")
    inline = generate("--prompt", text + prompt, "--max-tokens", "6", "--ignore-eos")
    assert behind.returncode == 0, behind.stderr
    assert behind.stdout == inline.stdout and "4821" in behind.stdout
    prefill, _ = STATS_LINE.match(behind.stderr.strip().splitlines()[-1]).groups()
    assert int(prefill) == len(engine.encode_prompt(prompt))  # the cartridge rows are no prefill
    foreign = save_cartridge(tmp_path / "foreign.safetensors", Cartridge(cartridge.k, cartridge.v, bytes(16)))
    refused = generate("--prompt", prompt, "--cartridge", str(foreign))
    assert refused.returncode != 0
    assert "foreign.safetensors: built for the model with fingerprint" in refused.stderr


def test_resolve_model_names_what_is_missing(tmp_path):
    with pytest.raises(ModelFileError, match="fetch_models gemma3-270m"):
        resolve_model("gemma3-270m", directory=tmp_path)
    assert resolve_model("").name == "SmolLM2-135M-Instruct.Q4_1.gguf"


def chunks(tmp_path: Path, parts: list[bytes]) -> list[Path]:
    paths = []
    for i, data in enumerate(parts):
        paths.append(tmp_path / f"part{i}")
        paths[-1].write_bytes(data)
    return paths


def test_assemble_concatenates_and_checks_size_and_hash(tmp_path):
    parts = [b"GGUF" + b"a" * 100, b"b" * 50]
    whole = b"".join(parts)
    spec = ChunkedModel("m.gguf", ("p1", "p2"), ("x", "y"), len(whole), hashlib.sha256(whole).hexdigest())
    assemble(spec, chunks(tmp_path, parts), tmp_path / "m.gguf")
    assert (tmp_path / "m.gguf").read_bytes() == whole


def test_assemble_with_a_wrong_hash_leaves_nothing_behind(tmp_path):
    parts = [b"GGUF", b"data"]
    spec = ChunkedModel("m.gguf", ("p1", "p2"), ("x", "y"), 8, "0" * 64)
    with pytest.raises(CommandError, match="expected 8 bytes with sha256 0000"):
        assemble(spec, chunks(tmp_path, parts), tmp_path / "m.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part0", "part1"]


SPEC_STATS = re.compile(r"; spec: (\d+)/(\d+) accepted$")
FRUITS = "apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango"
REPEAT_LIST = f"Repeat this list exactly: {FRUITS}."


@pytest.mark.slow  # two manage.py processes loading the model
@pytest.mark.serial  # counts accepted drafts: --spec's cost gate wants a quiet machine
def test_generate_spec_writes_the_same_text_and_reports_acceptance():
    args = ("--chat", "--prompt", REPEAT_LIST, "--max-tokens", "40")
    plain, spec = generate(*args), generate(*args, "--spec")
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout and "elderberry" in spec.stdout.lower()
    last = spec.stderr.strip().splitlines()[-1]
    accepted, drafted = map(int, SPEC_STATS.search(last).groups())
    assert STATS_LINE.match(SPEC_STATS.sub("", last)), last
    assert 0 < accepted <= drafted  # the reply copies the prompt: drafts from it were accepted
    assert "spec:" not in plain.stderr
