"""``manage.py lmserve --help`` describes the three dialects, the endpoints around them and
every flag."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from inference.management.commands.lmserve import Command

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
