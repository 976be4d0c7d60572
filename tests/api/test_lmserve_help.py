"""``manage.py lmserve --help`` describes the three dialects, the endpoints around them and
every flag."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management.base import CommandError

from api.management.commands.lmserve import Command
from inference.management.options import refuse_batch_with_fleet

ROOT = Path(__file__).resolve().parents[2]


def test_help_names_every_dialect_endpoint_and_flag():
    shown = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "lmserve", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    for dialect in ("OpenAI Chat Completions", "OpenAI Responses", "Anthropic Messages"):
        assert dialect in text
    for path in (
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/messages",
        "/health",
        "/metrics",
        "/openapi.json",
    ):
        assert path in text
    parser = Command().create_parser("manage.py", "lmserve")
    own = [
        a
        for a in parser._actions
        if a.dest
        not in {
            "help",
            "version",
            "verbosity",
            "settings",
            "pythonpath",
            "traceback",
            "no_color",
            "force_color",
            "skip_checks",
        }
    ]
    assert len(own) >= 14
    for action in own:
        assert action.help and len(action.help) > 20, f"{action.dest} has no real help"
        for flag in action.option_strings:
            assert flag in text


def test_batch_needs_a_positive_width_and_excludes_a_fleet():
    refused = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "lmserve", "--batch", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "--batch: must be at least 1, got 0" in refused.stderr
    refuse_batch_with_fleet(4, None)
    refuse_batch_with_fleet(1, "fleets/docs")
    with pytest.raises(CommandError, match="--batch 4 cannot be combined with --fleet"):
        refuse_batch_with_fleet(4, "fleets/docs")
