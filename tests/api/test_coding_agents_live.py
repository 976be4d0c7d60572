"""Coding agents as a user installs and runs them: Claude Code and Codex CLI from npm, unmodified
and with their default timeouts, against a live server for Qwen2.5-Coder with a 32k context.

Each agent works in a directory holding one file with a fact in it; a turn passes when the
agent exits 0, every request it made was answered 2xx (the server's own request counter), and,
where the turn is a tool task, the agent ran the tool (Claude Code must also report the fact
from it; what Codex's model says after its commands is not checked). The second Claude
Code prompt of a session is served from the warm KV slot (``cache_read_input_tokens``). The
agents' versions are the newest on npm at test time: clients move, and these tests are how we
learn it. Timings go to ``test-artifacts/coding_agents.json``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import ROOT, start_lmserve

# Opt-in (see docs/DEVELOPMENT.md): Claude Code's cold ~27k-token first prompt takes 4-20 minutes
# to prefill on a 2-core machine, past the client's own watchdog, and the 0.5B model's choices
# under Codex's ~9k-token prompt are sampled (it repeats a call, or calls write_stdin instead);
# one such run would hold back a whole landing.
OPTED_IN = os.environ.get("LMSERVE_AGENT_TESTS") == "1"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.serial,  # the agents' own timeouts: a 27k-token prefill wants both cores
    pytest.mark.timeout(3600),
    pytest.mark.skipif(not OPTED_IN, reason="coding agents from npm: set LMSERVE_AGENT_TESTS=1"),
]

AGENTS_DIR = Path(os.environ.get("LMSERVE_AGENTS_DIR", Path.home() / ".cache" / "lmserve" / "agents"))
PACKAGES = ("@anthropic-ai/claude-code", "@openai/codex")
FACT = "PELICAN-7"
NOTES = f"Project notes.\nThe launch code is {FACT}.\n"
ARTIFACTS = ROOT / "test-artifacts" / "coding_agents.json"
STATUS = re.compile(
    r'^lmserve_http_requests_total\{endpoint="(?P<endpoint>[^"]+)",status="(?P<status>\d+)"\} (?P<n>\S+)$'
)


@pytest.fixture(scope="module")
def agents() -> Path:
    """The agents' binaries, installed with npm as their READMEs say (into a cache directory)."""
    npm = shutil.which("npm")
    assert npm, "the coding-agent tests need Node.js and npm on PATH (Debian: apt-get install -y npm)"
    AGENTS_DIR.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            npm,
            "install",
            "--prefix",
            str(AGENTS_DIR),
            "--no-audit",
            "--no-fund",
            *(f"{p}@latest" for p in PACKAGES),
        ],
        check=True,
        timeout=900,
        capture_output=True,
    )
    return AGENTS_DIR / "node_modules" / ".bin"


@pytest.fixture(scope="module")
def model_server(tmp_path_factory):
    """Qwen2.5-Coder with a context that holds Claude Code's ~27k-token first prompt, greedy:
    neither agent sends a temperature, and ``--temp 0`` makes the small model's turns the same
    on every run (docs/CLIENTS.md recommends it)."""
    server = start_lmserve(
        tmp_path_factory.mktemp("coding-agents"),
        "models/qwen2.5-coder-0.5b-instruct.gguf",
        "--ctx",
        "32768",
        "--kv-slots",
        "2",
        "--temp",
        "0",
    )
    yield server
    server.stop()


@pytest.fixture
def workdir(tmp_path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "notes.txt").write_text(NOTES)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    return repo


def answered(server) -> dict[tuple[str, str], float]:
    """Requests the server answered so far, by endpoint and status."""
    counts = {}
    for line in httpx.get(server.url + "/metrics", timeout=10).text.splitlines():
        match = STATUS.match(line)
        if match:
            counts[(match["endpoint"], match["status"])] = float(match["n"])
    return counts


def made_since(before: dict, after: dict, endpoint: str) -> dict[str, float]:
    """Requests to ``endpoint`` answered between two readings, by status."""
    return {
        status: n - before.get((path, status), 0.0)
        for (path, status), n in after.items()
        if path == endpoint and n > before.get((path, status), 0.0)
    }


def record(name: str, figures: dict) -> None:
    ARTIFACTS.parent.mkdir(exist_ok=True)
    kept = json.loads(ARTIFACTS.read_text()) if ARTIFACTS.exists() else {}
    kept[name] = figures
    ARTIFACTS.write_text(json.dumps(kept, indent=2) + "\n")


# -- Claude Code ----------------------------------------------------------------------------
def claude_prompt(agents: Path, server, workdir: Path, home: Path, prompt: str) -> tuple[dict, list[dict]]:
    """One ``claude -p`` run with nothing set but the base URL and a key: its result record and
    every stream-json event (the tool calls it made among them)."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": server.url,
        "ANTHROPIC_API_KEY": "unused",
    }
    args = [str(agents / "claude"), "-p", prompt, "--output-format", "stream-json", "--verbose"]
    done = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True, timeout=3000)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0, (
        f"claude exited {done.returncode}:\n{done.stderr[-2000:]}\n{done.stdout[-2000:]}"
    )
    (result,) = [event for event in events if event.get("type") == "result"]
    return result, events


def tool_uses(events: list[dict]) -> list[dict]:
    return [
        block
        for event in events
        if event.get("type") == "assistant"
        for block in event["message"]["content"]
        if block.get("type") == "tool_use"
    ]


def test_claude_code_answers_then_reads_a_file_from_the_warm_cache(agents, model_server, workdir, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    before = answered(model_server)
    started = time.monotonic()
    first, _ = claude_prompt(agents, model_server, workdir, home, "What is the capital of France? One word.")
    first_seconds = time.monotonic() - started
    assert not first["is_error"], first
    assert "paris" in first["result"].lower(), first["result"]

    second, events = claude_prompt(
        agents,
        model_server,
        workdir,
        home,
        "Read the file notes.txt and tell me the launch code it contains.",
    )
    assert not second["is_error"], second
    reads = [use for use in tool_uses(events) if use["name"] == "Read"]
    assert reads and reads[0]["input"]["file_path"].endswith("notes.txt"), (
        tool_uses(events),
        second["result"],
    )
    assert FACT in second["result"], second["result"]
    usage = second["usage"]
    prompt_tokens = (
        usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
    )
    assert usage["cache_read_input_tokens"] >= 0.9 * prompt_tokens, usage

    statuses = made_since(before, answered(model_server), "/v1/messages")
    assert statuses and all(status.startswith("2") for status in statuses), statuses
    record(
        "claude_code",
        {
            "first_prompt_seconds": round(first_seconds, 1),
            "first_prompt_ttft_ms": first.get("ttft_ms"),
            "second_prompt_ms": second.get("duration_ms"),
            "second_prompt_cache_read_share": round(usage["cache_read_input_tokens"] / prompt_tokens, 3),
            "requests": statuses,
        },
    )


# -- Codex CLI ------------------------------------------------------------------------------
CODEX_CONFIG = """\
model = "local"
model_provider = "lmserve"
model_context_window = 32768

[model_providers.lmserve]
name = "lmserve"
base_url = "{url}/v1"
wire_api = "responses"
"""


def codex_exec(agents: Path, server, workdir: Path, home: Path, prompt: str) -> list[dict]:
    """One ``codex exec --json`` turn; its JSONL events. Approvals and the sandbox are off (the
    workdir is a scratch repository): under ``exec``'s approval policy ``never`` a call that
    asks for escalated permissions is refused, and the 0.5B model fills that optional argument
    at random from its description."""
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "CODEX_HOME": str(home / ".codex")}
    args = [
        str(agents / "codex"),
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        prompt,
    ]
    done = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True, timeout=3000)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0, (
        f"codex exited {done.returncode}:\n{done.stderr[-3000:]}\n{done.stdout[-3000:]}"
    )
    assert not [e for e in events if e.get("type") in ("turn.failed", "error")], events
    assert [e for e in events if e.get("type") == "turn.completed"], events
    return events


def items_of(events: list[dict], kind: str) -> list[dict]:
    return [e["item"] for e in events if e.get("type") == "item.completed" and e["item"].get("type") == kind]


def ran(events: list[dict], command: str) -> list[dict]:
    """The turn's completed executions of ``command`` (Codex wraps it in a shell)."""
    return [item for item in items_of(events, "command_execution") if command in item["command"]]


def test_codex_exec_reads_a_file_then_runs_a_command(agents, model_server, workdir, tmp_path):
    """Codex's first request carries a ~9k-token prompt and tools of every type (function,
    namespace, web_search); each turn must call exec_command through the call grammar, get the
    command's output back and finish. What the 0.5B model then says is its own: after a tool
    result it tends to repeat the call before it stops, so only the calls are checked."""
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(CODEX_CONFIG.format(url=model_server.url))
    before = answered(model_server)
    started = time.monotonic()
    read = codex_exec(
        agents,
        model_server,
        workdir,
        home,
        "Run the shell command `cat notes.txt` and tell me the launch code it contains.",
    )
    read_seconds = time.monotonic() - started
    cats = ran(read, "cat notes.txt")
    assert cats and FACT in cats[0]["aggregated_output"], read

    listed = codex_exec(
        agents, model_server, workdir, home, "Run the shell command `ls` and tell me which files it lists."
    )
    runs = ran(listed, "ls")
    assert runs and "notes.txt" in runs[0]["aggregated_output"], listed

    statuses = made_since(before, answered(model_server), "/v1/responses")
    assert statuses and all(status.startswith("2") for status in statuses), statuses
    record(
        "codex",
        {
            "read_turn_seconds": round(read_seconds, 1),
            "read_turn_commands": len(items_of(read, "command_execution")),
            "answers": [item.get("text", "") for item in items_of(read + listed, "agent_message")],
            "requests": statuses,
        },
    )
