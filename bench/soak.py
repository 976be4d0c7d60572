"""Soak: a loaded server for minutes on end, checked for what must never happen (docs/BENCHMARKS.md).

    .venv/bin/python bench/soak.py [--minutes 10] [--model PATH] [--queue 4] [--clients 2xQUEUE]
                                   [--seed 1] [--out soak.json]

Starts the server under test on loopback with ``--batch 4 --spec --kv-slots 4 --kv-cache-dir
TMP --queue N`` and keeps twice the queue's capacity of clients (threads, httpx) sending until
the time is up (and at most ``--max-requests``): a seeded mix of the three dialects, streamed
and not, about 10% hanging up mid-stream, some ``json_schema``-constrained replies, and forced
tool calls when the model has a tool convention. About 5% of the requests are greedy and are
sent again afterwards to a solo reference server (``--batch 1``, no ``--spec``, no disk tier),
whose replies must be byte-equal. The reference runs after the soak rather than beside it: the
two CPU-bound servers would otherwise share the cores, and the soak would load the server under
test less than the flags say; greedy replies do not depend on when they are asked.

Checks (the exit status is nonzero when one fails):

- every response is 200, 429 or cancelled by its client: no 5xx, nor any other status, as the
  client saw it and as the server's own /metrics counted it;
- every stream that was read to its end closes with its dialect's terminator (``data: [DONE]``,
  ``response.completed`` / ``response.incomplete``, ``message_stop``) and carries no error event;
- the sampled greedy replies equal the solo server's byte for byte;
- the server's RSS (VmRSS) at the end is at most 5% above its RSS after the warm-up (the first
  10% of the run); a fall is no leak and passes;
- the KV directory holds nothing but sidecars that open (no stale ``.tmp``), once idle and again
  after the server stopped.

Reported too: counts by dialect and status, p50/p99 time to first token of the streams.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from inference.kv.disk import scan_sidecars  # noqa: E402  (what the server itself calls a sidecar)
from tests.api.conftest import ServerProcess, start_lmserve  # noqa: E402  (the tests' launcher)

DIALECTS = ("chat", "responses", "messages")
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
CANCELLED = "cancelled"  # the client hung up mid-stream on purpose
RSS_TOLERANCE = 0.05
RSS_EVERY = 30.0  # seconds between the RSS samples kept in the report (the trend, not just two ends)
KV_DISK_SLOTS = 8  # the server's --kv-disk-slots: the most sidecars the KV directory may hold
SIDECAR_NAME = re.compile(r"[0-9a-f]{32}\.kv")  # inference.kv.disk names its files uuid4().hex + .kv
# Conversations repeat from a small pool, so slots are reused, evicted to the disk tier and
# restored from it; the number of distinct openings is above --kv-slots on purpose.
TOPICS = (
    "the sea",
    "a mountain village",
    "an old clock",
    "the first snow",
    "a lighthouse",
    "a library",
    "a train at night",
    "a garden in June",
    "a lost key",
    "the market square",
    "a quiet harbour",
    "a winter fox",
)
SYSTEMS = (
    "You are a careful writer. Keep replies short.",
    "You are a helpful assistant who answers plainly.",
    "You write for children: short sentences, simple words.",
)
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class SoakConfig:
    """One soak run's settings (the command line's flags)."""

    minutes: float = 10.0
    model: str = ""  # "" for the server's default model
    queue: int = 4
    clients: int = 0  # 0: twice the queue
    seed: int = 1
    max_requests: int = 100_000
    max_tokens: int = 24
    hangup_share: float = 0.10
    greedy_share: float = 0.05
    warmup_share: float = 0.10  # of the run, before the RSS baseline is taken
    log_dir: str = ""  # "" for a temporary directory

    @property
    def n_clients(self) -> int:
        return self.clients or 2 * self.queue


@dataclass(frozen=True)
class Planned:
    """One request the soak will send: its dialect, body and what the client does with it."""

    index: int
    dialect: str
    stream: bool
    kind: str  # "plain", "json" or "tool"
    greedy: bool  # sampled for the byte-equality check against the solo server
    hangup_after: int  # content events read before hanging up; 0 reads to the end
    body: dict


@dataclass
class Outcome:
    """What one request got."""

    index: int
    dialect: str
    stream: bool
    kind: str
    status: str  # "200", "429", ..., "cancelled", or "transport: <error>"
    ttft: float | None = None  # seconds to the first content event of a stream
    terminated: bool | None = None  # a stream read to its end: did it close with its terminator?
    stream_error: str = ""  # an error event inside a 200 stream
    reply: str = ""  # the reply as comparable text (greedy requests only)


class RssSample(NamedTuple):
    """The server's VmRSS (KiB) some seconds into the load."""

    seconds: float
    kib: int


@dataclass
class SoakReport:
    """The figures and checks of one run (the --out JSON)."""

    config: dict
    seconds: float
    requests: int
    by_status: dict[str, int]
    by_dialect_status: dict[str, dict[str, int]]
    by_kind_status: dict[str, dict[str, int]]  # plain, json (constrained), tool
    server_statuses: dict[str, int]  # /metrics' lmserve_http_requests_total by status
    five_xx: int
    other_statuses: dict[str, int]
    unterminated: int
    stream_errors: list[str]
    greedy_sampled: int
    greedy_mismatches: list[dict]
    rss_kib: dict[str, int]
    rss_growth: float
    rss_samples: list[RssSample]
    kv_files_idle: list[str]
    stale_kv_files: list[str]
    ttft_p50: float | None
    ttft_p99: float | None
    failures: list[str] = field(default_factory=list)


# -- the request mix -----------------------------------------------------------------------------
def plan(rng: random.Random, index: int, tools: bool, config: SoakConfig) -> Planned:
    """One seeded request of the mix."""
    dialect = rng.choice(DIALECTS)
    hangup = rng.random() < config.hangup_share
    greedy = not hangup and rng.random() < config.greedy_share
    stream = hangup or rng.random() < 0.5
    kinds = ["plain"] * 6 + ["json"] * 2 + (["tool"] * 2 if tools else [])
    kind = rng.choice(kinds)
    topic = rng.choice(TOPICS)
    system = rng.choice(SYSTEMS)
    if kind == "json":
        question = f"Invent a person who lives near {topic}. Answer in JSON."
    elif kind == "tool":
        question = f"What is the weather in the town by {topic}, in celsius?"
    else:
        question = f"Write a few lines about {topic}."
    body = dialect_body(dialect, system, question, kind, config.max_tokens)
    body["stream"] = stream
    if greedy:
        body["temperature"] = 0
    else:
        body["temperature"] = round(rng.uniform(0.5, 1.0), 2)
    return Planned(index, dialect, stream, kind, greedy, rng.randint(1, 4) if hangup else 0, body)


def dialect_body(dialect: str, system: str, question: str, kind: str, max_tokens: int) -> dict:
    """The request body of ``dialect`` for one question, with its constraint or tool."""
    if dialect == "chat":
        body = {
            "model": "m",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": max_tokens,
        }
        if kind == "json":
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
        elif kind == "tool":
            function = {"name": "get_weather", "description": "Current weather.", "parameters": WEATHER}
            body["tools"] = [{"type": "function", "function": function}]
            body["tool_choice"] = "required"
        return body
    if dialect == "responses":
        body = {"model": "m", "instructions": system, "input": question, "max_output_tokens": max_tokens}
        if kind == "json":
            body["text"] = {"format": {"type": "json_schema", "name": "p", "schema": PERSON, "strict": True}}
        elif kind == "tool":
            body["tools"] = [
                {
                    "type": "function",
                    "name": "get_weather",
                    "description": "Current weather.",
                    "parameters": WEATHER,
                }
            ]
            body["tool_choice"] = "required"
        return body
    body = {
        "model": "m",
        "system": system,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
    }
    if kind == "json":
        body["output_config"] = {"format": {"type": "json_schema", "schema": PERSON}}
    elif kind == "tool":
        body["tools"] = [{"name": "get_weather", "description": "Current weather.", "input_schema": WEATHER}]
        body["tool_choice"] = {"type": "any"}
    return body


# -- reading replies -----------------------------------------------------------------------------
def reply_of(dialect: str, payload: dict) -> str:
    """A non-streamed reply's text and tool calls as one comparable string."""
    parts: list[str] = []
    if dialect == "chat":
        message = payload["choices"][0]["message"]
        parts.append(message.get("content") or "")
        for call in message.get("tool_calls") or []:
            parts.append(f"<call {call['function']['name']} {call['function']['arguments']}>")
    elif dialect == "responses":
        for item in payload["output"]:
            if item["type"] == "message":
                parts.extend(c.get("text", "") for c in item["content"])
            elif item["type"] == "function_call":
                parts.append(f"<call {item['name']} {item['arguments']}>")
    else:
        for block in payload["content"]:
            if block["type"] == "text":
                parts.append(block["text"])
            elif block["type"] == "tool_use":
                parts.append(f"<call {block['name']} {json.dumps(block['input'], sort_keys=True)}>")
    return "".join(parts)


@dataclass
class StreamState:
    """What a stream has carried so far, event by event."""

    dialect: str
    content_events: int = 0
    terminated: bool = False
    error: str = ""
    text: list[str] = field(default_factory=list)
    final: dict | None = None  # the Responses terminator's full response

    def feed(self, event: str, data: str) -> None:
        """Take one SSE event (its ``event:`` name, if any, and its data)."""
        if self.dialect == "chat":
            if data == "[DONE]":
                self.terminated = True
                return
            chunk = json.loads(data)
            if "error" in chunk:
                self.error = json.dumps(chunk["error"])
                return
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    self.content_events += 1
                    self.text.append(delta["content"])
                for call in delta.get("tool_calls") or []:
                    self.content_events += 1
                    function = call.get("function") or {}
                    if function.get("name"):
                        self.text.append(f"<call {function['name']} ")
                    self.text.append(function.get("arguments") or "")
            return
        message = json.loads(data)
        kind = message.get("type", event)
        if self.dialect == "responses":
            if kind in ("response.output_text.delta", "response.function_call_arguments.delta"):
                self.content_events += 1
            elif kind in ("response.completed", "response.incomplete"):
                self.terminated = True
                self.final = message["response"]
            elif kind in ("error", "response.failed"):
                self.error = data
            return
        if kind == "content_block_delta":
            self.content_events += 1
        elif kind == "message_stop":
            self.terminated = True
        elif kind == "error":
            self.error = data
        if kind == "content_block_start" and message["content_block"]["type"] == "tool_use":
            self.text.append(f"<call {message['content_block']['name']} ")
        elif kind == "content_block_delta":
            delta = message["delta"]
            self.text.append(delta.get("text") or delta.get("partial_json") or "")

    def reply(self) -> str:
        """The streamed reply, comparable with the same request's on another server."""
        if self.dialect == "responses" and self.final is not None:
            return reply_of("responses", self.final)
        return "".join(self.text)


def send(http: httpx.Client, request: Planned) -> Outcome:
    """Send one planned request and read (or abandon) its reply."""
    outcome = Outcome(request.index, request.dialect, request.stream, request.kind, status="")
    path = PATHS[request.dialect]
    headers = {"anthropic-version": "2023-06-01"} if request.dialect == "messages" else {}
    try:
        if not request.stream:
            response = http.post(path, json=request.body, headers=headers)
            outcome.status = str(response.status_code)
            if response.status_code == 200 and request.greedy:
                outcome.reply = reply_of(request.dialect, response.json())
            return outcome
        start = time.perf_counter()
        with http.stream("POST", path, json=request.body, headers=headers) as response:
            outcome.status = str(response.status_code)
            if response.status_code != 200:
                response.read()
                return outcome
            state = StreamState(request.dialect)
            event = ""
            for line in response.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                    continue
                if not line.startswith("data: "):
                    continue
                before = state.content_events
                state.feed(event, line[6:])
                event = ""
                if state.content_events and not before:
                    outcome.ttft = time.perf_counter() - start
                if request.hangup_after and state.content_events >= request.hangup_after:
                    outcome.status = CANCELLED  # leaving the with block closes the connection
                    return outcome
            outcome.terminated = state.terminated
            outcome.stream_error = state.error
            if request.greedy:
                outcome.reply = state.reply()
    except httpx.HTTPError as exc:
        outcome.status = f"transport: {type(exc).__name__}: {exc}"
    return outcome


# -- the checks ----------------------------------------------------------------------------------
def five_xx(statuses: dict[str, int]) -> int:
    """Responses with a 5xx status."""
    return sum(n for status, n in statuses.items() if status.isdigit() and status.startswith("5"))


def unexpected_statuses(statuses: dict[str, int]) -> dict[str, int]:
    """Statuses other than 200, 429 and a client's own hang-up (5xx included)."""
    return {status: n for status, n in statuses.items() if status not in ("200", "429", CANCELLED)}


def unterminated(outcomes: list[Outcome]) -> list[Outcome]:
    """Streams read to their end (200, not hung up) that did not close with their terminator."""
    return [o for o in outcomes if o.stream and o.status == "200" and not o.terminated]


def greedy_mismatches(soaked: list[Outcome], solo: dict[int, str]) -> list[dict]:
    """Greedy replies that differ from the solo server's reply to the same request."""
    return [
        {
            "index": o.index,
            "dialect": o.dialect,
            "stream": o.stream,
            "soak": o.reply,
            "solo": solo.get(o.index),
        }
        for o in soaked
        if o.index in solo and o.reply != solo[o.index]
    ]


def rss_growth(baseline_kib: int, end_kib: int) -> float:
    """The RSS change from the warmed-up baseline to the end, as a fraction of the baseline."""
    return (end_kib - baseline_kib) / baseline_kib


def stale_kv_files(directory: Path) -> list[str]:
    """Files in the KV directory that are not sidecars the server can open (a .tmp left behind,
    a torn or foreign file)."""
    good = {entry["name"] for entry in scan_sidecars(directory) if "error" not in entry}
    return sorted(
        path.name
        for path in directory.iterdir()
        if not (SIDECAR_NAME.fullmatch(path.name) and path.name in good)
    )


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def failures_of(report: SoakReport, max_kv_files: int) -> list[str]:
    """Every check the report fails, as sentences."""
    failed = []
    if report.five_xx:
        failed.append(f"{report.five_xx} responses with a 5xx status")
    server_5xx = five_xx(report.server_statuses)
    if server_5xx:
        failed.append(f"the server's /metrics counted {server_5xx} 5xx responses")
    others = {s: n for s, n in report.other_statuses.items() if not (s.isdigit() and s.startswith("5"))}
    if others:
        failed.append(f"statuses other than 200 / 429 / cancelled: {others}")
    answered = sum(report.server_statuses.values())
    if answered != report.requests:
        failed.append(
            f"the clients sent {report.requests} requests, the server's /metrics counted {answered}"
        )
    if report.unterminated:
        failed.append(f"{report.unterminated} completed streams without their terminator")
    if report.stream_errors:
        failed.append(
            f"{len(report.stream_errors)} streams carried an error event: {report.stream_errors[:3]}"
        )
    if report.greedy_mismatches:
        failed.append(f"{len(report.greedy_mismatches)} greedy replies differ from the solo server's")
    if report.greedy_sampled == 0:
        failed.append("no greedy reply was sampled: the equality check did not run")
    if report.rss_growth > RSS_TOLERANCE:
        failed.append(f"RSS grew {report.rss_growth:.1%} after the warm-up (over {RSS_TOLERANCE:.0%})")
    if report.stale_kv_files:
        failed.append(f"files left in the KV directory that are not live sidecars: {report.stale_kv_files}")
    if len(report.kv_files_idle) > max_kv_files:
        failed.append(f"{len(report.kv_files_idle)} sidecars, over --kv-disk-slots {max_kv_files}")
    if report.by_status.get("200", 0) == 0:
        failed.append("no request succeeded")
    return failed


# -- running -------------------------------------------------------------------------------------
def rss_kib(pid: int) -> int:
    """The resident set of a process, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def server_statuses(url: str) -> dict[str, int]:
    """lmserve_http_requests_total of the three dialects' endpoints, summed by status (the
    /health probes are left out: a loading server answers them 503 on purpose)."""
    counts: Counter[str] = Counter()
    text = httpx.get(url + "/metrics", timeout=30).text
    for line in text.splitlines():
        found = re.fullmatch(r'lmserve_http_requests_total\{endpoint="([^"]*)",status="(\d+)"\} (\S+)', line)
        if found and found.group(1) in PATHS.values():
            counts[found.group(2)] += int(float(found.group(3)))
    return dict(counts)


def soak(
    server: ServerProcess, config: SoakConfig, tools: bool
) -> tuple[list[Outcome], list[Planned], int, list[RssSample]]:
    """Drive ``server`` with the client threads until the time or the request budget runs out;
    the outcomes, the greedy requests sent, the RSS (KiB) after the warm-up and its samples."""
    deadline = time.monotonic() + config.minutes * 60
    warm_at = time.monotonic() + config.minutes * 60 * config.warmup_share
    lock = threading.Lock()
    outcomes: list[Outcome] = []
    greedy: list[Planned] = []
    counter = iter(range(config.max_requests))

    def client(number: int) -> None:
        rng = random.Random(config.seed * 1_000_003 + number)
        with httpx.Client(base_url=server.url, timeout=600) as http:
            while time.monotonic() < deadline:
                with lock:
                    index = next(counter, None)
                if index is None:
                    return
                request = plan(rng, index, tools, config)
                outcome = send(http, request)
                with lock:
                    outcomes.append(outcome)
                    if request.greedy and outcome.status == "200":
                        greedy.append(request)
                if outcome.status == "429":
                    time.sleep(rng.uniform(0.05, 0.5))  # back off a little; the queue stays full

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(config.n_clients)]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    samples: list[RssSample] = []
    baseline = None
    while any(t.is_alive() for t in threads):
        now = time.monotonic()
        if baseline is None and now >= warm_at:
            baseline = rss_kib(server.process.pid)
        if not samples or now - started >= samples[-1].seconds + RSS_EVERY:
            samples.append(RssSample(round(now - started, 1), rss_kib(server.process.pid)))
        time.sleep(0.5)
    for thread in threads:
        thread.join()
    if baseline is None:  # the request budget ran out before the warm-up did
        baseline = rss_kib(server.process.pid)
    return outcomes, greedy, baseline, samples


def solo_replies(model: str, greedy: list[Planned], log_dir: Path) -> dict[int, str]:
    """The solo reference server's reply to each greedy request, sent the same way."""
    server = start_lmserve(log_dir, *([model] if model else []), "--batch", "1", "--kv-slots", "1")
    try:
        replies = {}
        with httpx.Client(base_url=server.url, timeout=600) as http:
            for request in greedy:
                outcome = send(http, request)
                if outcome.status != "200":
                    raise RuntimeError(
                        f"the solo server answered {outcome.status} to request {request.index}"
                    )
                replies[request.index] = outcome.reply
        return replies
    finally:
        server.stop()


def run(config: SoakConfig) -> SoakReport:
    """One soak: the server under test, the load, the solo reference, the report and its checks."""
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        logs = Path(config.log_dir) if config.log_dir else Path(tmp)
        kv_dir = Path(tmp) / "kv"
        kv_dir.mkdir()
        (logs / "soak").mkdir(parents=True, exist_ok=True)
        (logs / "solo").mkdir(parents=True, exist_ok=True)
        flags = ["--batch", "4", "--spec", "--kv-slots", "4", "--kv-cache-dir", str(kv_dir)]
        flags += ["--kv-disk-slots", str(KV_DISK_SLOTS)]
        flags += ["--queue", str(config.queue), "--ctx", "1024"]
        server = start_lmserve(logs / "soak", *([config.model] if config.model else []), *flags)
        try:
            tools = bool(server.health()["capabilities"]["tools"])
            rss_start = rss_kib(server.process.pid)
            started = time.monotonic()
            outcomes, greedy, rss_warm, samples = soak(server, config, tools)
            seconds = time.monotonic() - started
            server.wait_idle(timeout=600)
            rss_end = rss_kib(server.process.pid)
            metrics = server_statuses(server.url)
            kv_idle = sorted(p.name for p in kv_dir.iterdir())
            stale = stale_kv_files(kv_dir)
        finally:
            code = server.stop()
        stale_after = stale_kv_files(kv_dir)
        solo = solo_replies(config.model, greedy, logs / "solo")
    by_status = Counter(o.status for o in outcomes)
    by_dialect: dict[str, Counter] = {d: Counter() for d in DIALECTS}
    for o in outcomes:
        by_dialect[o.dialect][o.status] += 1
    by_kind: dict[str, Counter] = {}
    for o in outcomes:
        by_kind.setdefault(o.kind, Counter())[o.status] += 1
    greedy_ids = {r.index for r in greedy}
    ttfts = [o.ttft for o in outcomes if o.ttft is not None]
    report = SoakReport(
        config={**dataclasses.asdict(config), "clients": config.n_clients, "tools": tools},
        seconds=round(seconds, 1),
        requests=len(outcomes),
        by_status=dict(by_status),
        by_dialect_status={d: dict(c) for d, c in by_dialect.items()},
        by_kind_status={k: dict(c) for k, c in sorted(by_kind.items())},
        server_statuses=metrics,
        five_xx=five_xx(by_status),
        other_statuses=unexpected_statuses(by_status),
        unterminated=len(unterminated(outcomes)),
        stream_errors=[f"{o.index} {o.dialect}: {o.stream_error}" for o in outcomes if o.stream_error],
        greedy_sampled=len(greedy),
        greedy_mismatches=greedy_mismatches([o for o in outcomes if o.index in greedy_ids], solo),
        rss_kib={"start": rss_start, "after_warmup": rss_warm, "end": rss_end},
        rss_growth=round(rss_growth(rss_warm, rss_end), 4),
        rss_samples=samples,
        kv_files_idle=kv_idle,
        stale_kv_files=sorted(set(stale) | set(stale_after)),
        ttft_p50=percentile(ttfts, 0.50),
        ttft_p99=percentile(ttfts, 0.99),
    )
    report.failures = failures_of(report, max_kv_files=KV_DISK_SLOTS)
    if code != 0:
        report.failures.append(f"the server under test exited with {code} on SIGTERM")
    return report


def trend(samples: list[RssSample], points: int = 12) -> str:
    """At most ``points`` RSS samples, evenly spaced, as "seconds: MiB"."""
    step = max(1, -(-len(samples) // points))
    return ", ".join(f"{s.seconds:.0f}s: {s.kib // 1024}" for s in samples[::step]) + " MiB"


def table(report: SoakReport) -> str:
    """The report as a printed table."""
    ms = lambda s: "-" if s is None else f"{s * 1000:.0f} ms"  # noqa: E731
    rss = report.rss_kib
    rows = [
        (
            "duration",
            f"{report.seconds:.0f} s, {report.config['clients']} clients, queue {report.config['queue']}",
        ),
        ("requests", str(report.requests)),
        ("by status", ", ".join(f"{s}: {n}" for s, n in sorted(report.by_status.items()))),
        *(
            (f"  {name}", ", ".join(f"{s}: {n}" for s, n in sorted(counts.items())))
            for name, counts in {**report.by_dialect_status, **report.by_kind_status}.items()
        ),
        ("server /metrics", ", ".join(f"{s}: {n}" for s, n in sorted(report.server_statuses.items()))),
        ("5xx", str(report.five_xx)),
        ("streams without terminator", str(report.unterminated)),
        ("stream error events", str(len(report.stream_errors))),
        ("greedy mismatches", f"{len(report.greedy_mismatches)} of {report.greedy_sampled} sampled"),
        (
            "RSS start / warm / end",
            f"{rss['start'] // 1024} / {rss['after_warmup'] // 1024} / {rss['end'] // 1024} MiB",
        ),
        ("RSS growth after warm-up", f"{report.rss_growth:+.1%}"),
        ("RSS over the run", trend(report.rss_samples)),
        ("KV files when idle", f"{len(report.kv_files_idle)} sidecars"),
        ("stale KV files", str(len(report.stale_kv_files))),
        ("TTFT p50 / p99 (streams)", f"{ms(report.ttft_p50)} / {ms(report.ttft_p99)}"),
        ("result", "PASS" if not report.failures else "FAIL: " + "; ".join(report.failures)),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="load duration (default 10)")
    parser.add_argument("--model", default="", help="GGUF path (default: the server's default model)")
    parser.add_argument("--queue", type=int, default=4, help="the server's --queue (default 4)")
    parser.add_argument("--clients", type=int, default=0, help="client threads (default: 2 x --queue)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the request mix (default 1)")
    parser.add_argument("--max-requests", type=int, default=100_000, help="request budget (default 100000)")
    parser.add_argument("--max-tokens", type=int, default=24, help="reply budget per request (default 24)")
    parser.add_argument("--out", default="", help="write the report as JSON here")
    args = parser.parse_args()
    if args.minutes <= 0 or args.minutes > 120:
        parser.error("--minutes must be in (0, 120]")
    if args.queue < 1 or args.clients < 0 or args.max_requests < 1:
        parser.error("--queue and --max-requests must be positive, --clients not negative")
    config = SoakConfig(
        minutes=args.minutes,
        model=args.model,
        queue=args.queue,
        clients=args.clients,
        seed=args.seed,
        max_requests=args.max_requests,
        max_tokens=args.max_tokens,
    )
    print(f"load average before: {os.getloadavg()}", flush=True)
    report = run(config)
    print(f"load average after: {os.getloadavg()}")
    print(table(report))
    if args.out:
        Path(args.out).write_text(json.dumps(dataclasses.asdict(report), indent=2) + "\n")
    sys.exit(1 if report.failures else 0)


if __name__ == "__main__":
    main()
