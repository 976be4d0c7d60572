"""``--experts {repack,borrow}`` on ``manage.py lmserve`` and ``manage.py generate``: parsed,
refused when unknown, carried to the engine through the worker, reported by /health."""

from __future__ import annotations

import logging

import pytest
from django.core.management import CommandError, call_command

from api.management.commands.lmserve import Command as LmserveCommand
from inference.kv.ram_guard import MIB
from inference.management.commands.generate import Command as GenerateCommand
from inference.runtime.service import InferenceService, ServeConfig
from inference.runtime.worker import READY
from tests.fixtures.synthetic_gemma4 import gemma4_path
from tests.fixtures.synthetic_gguf import synthetic_path


@pytest.mark.parametrize("command", [LmserveCommand, GenerateCommand])
def test_the_flag_parses_with_or_without_an_equals_sign(command):
    parser = command().create_parser("manage.py", "cmd")
    required = ["--prompt", "x"] if command is GenerateCommand else []
    assert parser.parse_args(required).experts == "repack"
    assert parser.parse_args([*required, "--experts=borrow"]).experts == "borrow"
    assert parser.parse_args([*required, "--experts", "borrow"]).experts == "borrow"
    assert parser.parse_args(required).expert_cache == 16
    assert parser.parse_args([*required, "--expert-cache", "64"]).expert_cache == 64


@pytest.mark.parametrize("args", [["lmserve"], ["generate", "--prompt", "x"]])
def test_an_unknown_mode_is_refused_naming_the_choices(args):
    with pytest.raises(CommandError, match=r"--experts: invalid choice: 'lend'.*'repack', 'borrow'"):
        call_command(*args, "--experts=lend")


@pytest.mark.parametrize("args", [["lmserve"], ["generate", "--prompt", "x"]])
def test_an_expert_cache_below_one_is_refused(args):
    with pytest.raises(CommandError, match="--expert-cache"):
        call_command(*args, "--expert-cache=0")


@pytest.mark.slow
def test_the_server_loads_a_moe_model_with_borrowed_experts_and_says_so(synthetic_dir, caplog):
    path = gemma4_path("gemma4-moe", synthetic_dir)
    service = InferenceService(ServeConfig(model=str(path), ctx=128, experts="borrow", expert_cache=3), path)
    assert service.health()["experts"] is None  # not loaded yet
    with caplog.at_level(logging.INFO):
        assert service.worker._load() and service.worker.state == READY
    engine = service.worker.backend.engine
    options = engine.file.options
    assert options.experts == "borrow" and options.expert_cache == 3
    # The KV RAM guard sets aside what the borrowed experts take once serving.
    assert engine.serving_bytes > 0
    assert f"less {engine.serving_bytes / MIB:.1f} MiB kept for serving" in caplog.text
    assert service.health()["experts"] == "borrow"
    dense = gemma4_path("gemma4", synthetic_dir)
    plain = InferenceService(ServeConfig(model=str(dense), ctx=128, experts="borrow"), dense)
    assert plain.worker._load() and plain.health()["experts"] is None  # nothing to borrow


@pytest.mark.slow
def test_generate_writes_the_same_text_with_borrowed_experts(synthetic_dir, capsys):
    path = str(synthetic_path("qwen3moe", synthetic_dir))
    texts = []
    for mode in ("repack", "borrow"):
        call_command(
            "generate",
            path,
            "--prompt",
            "Once upon",
            "--max-tokens",
            "6",
            "--ignore-eos",
            f"--experts={mode}",
        )
        out, err = capsys.readouterr()
        assert err.strip().splitlines()[-1].startswith("prefill: ")
        texts.append(out)
    assert texts[0] == texts[1] and texts[0].strip()
