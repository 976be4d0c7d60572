"""``--batch N`` live: lockstep batches are invisible in the replies, and each stream of a batch
ends on its own.

Requests are made to queue together behind a "blocker" stream: once all of them wait, the
blocker hangs up and the worker takes them in one batch (what an idle server never does: it
serves a lone request at once). The same requests, queued the same way in the same order, go
to a ``--batch 1`` server; replies, finish reasons and usage (cached_tokens included) must be
equal, turn after turn. /metrics proves the batches ran.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time

import httpx
import pytest

from tests.api.conftest import start_lmserve
from tests.api.rawhttp import RawRequest, count_frames
from tests.fixtures.think_gguf import ANSWER_TEXT, THINK_TEXT, think_model_path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

HI = [{"role": "user", "content": "Hi"}]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def endless(max_tokens: int = 4000) -> dict:
    return {"messages": HI, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}


def chat(user: str, **fields) -> dict:
    return {"messages": [{"role": "user", "content": user}], "temperature": 0, **fields}


def queued_together(server, bodies: list[dict], hold=None, width: int | None = None) -> list[httpx.Response]:
    """POST each body to /v1/chat/completions, queued in this order behind a busy worker, then
    let the worker take them. The worker is kept busy by ``width`` endless streams (default:
    :func:`blockers_needed`); closing them lets the queued bodies in, each as a blocker's
    stream ends (within a step or two of each other). ``hold(i)`` may return a RawRequest to
    send body i itself (a client that reads nothing, or hangs up); its slot in the result is
    None."""
    width = blockers_needed(server) if width is None else width
    blockers: list[RawRequest] = []
    replies: list[httpx.Response | None] = [None] * len(bodies)
    threads = []
    try:
        for _ in range(width):
            blockers.append(RawRequest(server.url, "/v1/chat/completions", endless()))
            blockers[-1].read_until(lambda got: count_frames(got) >= 1)
        for i, body in enumerate(bodies):
            if hold is None or not hold(i, body):
                threads.append(threading.Thread(target=_post, args=(server.url, body, replies, i)))
                threads[-1].start()
            server.wait_until(lambda h, n=i + 1: h["queued"] == n)
    finally:
        for blocker in blockers:
            blocker.close()
    for thread in threads:
        thread.join(600)
    return replies


def blockers_needed(server) -> int:
    """Streams that keep the worker from taking a queued request: the server's ``--batch``
    (requests join a running batch up to its width), or 1 where a lone request decodes
    speculatively (nothing joins it; ``--spec`` exports the drafted-token counter)."""
    if "llamacpp:tokens_drafted" in httpx.get(server.url + "/metrics", timeout=30).text:
        return 1
    return int(metric(server, "lmserve_batch_width"))


def _post(url: str, body: dict, replies: list, i: int) -> None:
    replies[i] = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)


def metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def outcome(reply: httpx.Response) -> tuple:
    """What a user of the reply sees: the message, how it finished, and its usage."""
    assert reply.status_code == 200, reply.text
    data = reply.json()
    choice, usage = data["choices"][0], data["usage"]
    message = dict(choice["message"])
    if message.get("tool_calls"):  # call ids are minted per reply
        message["tool_calls"] = [{**call, "id": None} for call in message["tool_calls"]]
    return (
        message,
        choice["finish_reason"],
        usage["prompt_tokens"],
        usage["completion_tokens"],
        usage["prompt_tokens_details"]["cached_tokens"],
    )


def follow_up(body: dict, reply: httpx.Response) -> dict:
    message = reply.json()["choices"][0]["message"]
    said = {"role": "assistant", "content": message.get("content") or ""}
    return {**body, "messages": [*body["messages"], said, {"role": "user", "content": "Go on."}]}


def compare_turns(plain, batched, bodies: list[dict], turns: int = 2) -> list[list[httpx.Response]]:
    """Each turn's replies from both servers, checked equal; the batched server's replies."""
    seen = []
    for _ in range(turns):
        want = queued_together(plain, bodies)
        got = queued_together(batched, bodies)
        assert [outcome(r) for r in got] == [outcome(r) for r in want]
        seen.append(got)
        bodies = [follow_up(body, reply) for body, reply in zip(bodies, got, strict=True)]
    return seen


@contextlib.contextmanager
def plain_and_batched(tmp_path_factory, name: str, *flags: str, disk: bool = False):
    """Two servers of the same flags, ``--batch 1`` and ``--batch 4`` (with ``disk``, each its
    own --kv-cache-dir), each with a KV slot per blocker of :func:`queued_together` (one per
    batch slot) and one for each of four conversations, so the conversations' slots live
    and die alike on both."""
    started = []
    try:
        for batch in (1, 4):
            log_dir = tmp_path_factory.mktemp(f"{name}-batch{batch}")
            extra = ["--kv-cache-dir", str(log_dir / "kv")] if disk else []
            slots = ["--kv-slots", str(batch + 4)]
            started.append(start_lmserve(log_dir, *flags, *extra, *slots, "--batch", str(batch)))
        yield started
    finally:
        for server in started:
            server.stop()


SMOLLM2_FLAGS = ("--queue", "8", "--ctx", "1024")


@pytest.fixture(scope="module")
def smollm2_pair(tmp_path_factory):
    """The default model served plainly and with --batch 4."""
    with plain_and_batched(tmp_path_factory, "smollm2", *SMOLLM2_FLAGS) as pair:
        yield pair


def long_question(topic: str) -> str:
    """A prompt most of whose tokens are its own, so a slot holding it is spilled (it keeps
    under half of it) when an unrelated conversation takes the slot."""
    return (
        f"Here are my notes on {topic}: " + " ".join(f"{topic} point {i}." for i in range(30)) + " Summarize."
    )


def test_disk_tier_restores_are_those_of_a_plain_server(tmp_path_factory):
    """Four conversations, then four others that push them out of the slots onto the disk tier,
    then the first four's follow-ups, restored from their sidecar files: equal on both servers."""
    with plain_and_batched(tmp_path_factory, "disk", *SMOLLM2_FLAGS, disk=True) as (plain, batched):
        first = [chat(long_question(t), max_tokens=16) for t in ("rivers", "stars", "bread", "chess")]
        others = [chat(long_question(t), max_tokens=8) for t in ("ships", "moths", "glass", "tea")]
        (replies,) = compare_turns(plain, batched, first, turns=1)
        compare_turns(plain, batched, others, turns=1)
        back = [follow_up(body, reply) for body, reply in zip(first, replies, strict=True)]
        (restored,) = compare_turns(plain, batched, back, turns=1)
        # The four follow-ups came back from disk on both (and the blockers' own short
        # conversations may too: one plain blocker, four batched), with equal replies and
        # cached counts (compare_turns): the batched server restored what the plain one did.
        disk_hits = 'lmserve_kv_hits_total{tier="disk"}'
        assert metric(batched, disk_hits) >= 4 and metric(plain, disk_hits) >= 4
        for reply in restored:
            usage = reply.json()["usage"]
            assert usage["prompt_tokens_details"]["cached_tokens"] > usage["prompt_tokens"] // 2


def test_greedy_and_seeded_replies_are_those_of_a_plain_server(smollm2_pair):
    plain, batched = smollm2_pair
    bodies = [
        chat("Name the capital city of France.", max_tokens=24),
        chat("Write a short poem about the sea, in four lines.", max_tokens=40, stop=["\n\n", "waves"]),
        chat(
            "Invent a person.",
            max_tokens=48,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
        ),
        chat("Tell me a story about a dragon.", temperature=0.9, top_p=0.95, seed=1234, max_tokens=32),
    ]
    before = metric(batched, "lmserve_lockstep_streams_total")
    first, second = compare_turns(plain, batched, bodies)
    # Each turn is one lockstep run: the four blockers that held the batch, and the four
    # bodies that joined it as the blockers hung up.
    assert metric(batched, "lmserve_lockstep_streams_total") - before == 16
    assert metric(batched, "lmserve_batch_width") == 4
    assert json.loads(first[2].json()["choices"][0]["message"]["content"]).keys() == {"name", "age"}
    # Follow-up turns continue their own slot in the batch: most of the prompt is cached.
    for reply in second:
        usage = reply.json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] > usage["prompt_tokens"] // 2


def test_a_request_joins_the_batch_running_when_it_arrives(smollm2_pair):
    """Continuous batching: a request sent while a long stream decodes is answered while that
    stream still streams (it joined the running batch; a server without joins would answer it
    only after the 4000 tokens), with the reply a plain server gives, and counted in /health's
    ``tokens_generated`` as it ends, not when the batch does."""
    plain, batched = smollm2_pair
    body = chat("Name the capital city of France.", max_tokens=16)
    want = httpx.post(plain.url + "/v1/chat/completions", json=body, timeout=600)
    batched.wait_idle(timeout=600)
    before = metric(batched, "lmserve_lockstep_batches_total")
    tokens_before = batched.health()["tokens_generated"]
    running = RawRequest(batched.url, "/v1/chat/completions", endless())
    try:
        running.read_until(lambda got: count_frames(got) >= 2)
        got = httpx.post(batched.url + "/v1/chat/completions", json=body, timeout=600)
        # cached_tokens aside: the joiner may reuse the template rows of the stream beside it
        assert outcome(got)[:4] == outcome(want)[:4]
        counted = batched.health()["tokens_generated"] - tokens_before
        assert counted == got.json()["usage"]["completion_tokens"]  # the long one is still running
        more = count_frames(running.received) + 2
        running.read_until(lambda got: count_frames(got) >= more or b"[DONE]" in got)
        assert b"[DONE]" not in running.received  # the long stream goes on
    finally:
        running.close()
    batched.wait_idle(timeout=600)
    assert metric(batched, "lmserve_lockstep_batches_total") == before + 1  # the two, as one run


@pytest.fixture(scope="module")
def think_pair(synthetic_dir, tmp_path_factory):
    """The synthetic think model (a qwen3 with tools and a reasoning channel), plain and --batch 4."""
    flags = (str(think_model_path(synthetic_dir)), "--queue", "8", "--ctx", "512")
    with plain_and_batched(tmp_path_factory, "think", *flags) as pair:
        yield pair


def test_tool_calls_reasoning_and_stops_route_per_stream(think_pair):
    plain, batched = think_pair
    bodies = [
        chat("Hi", max_tokens=40, reasoning_effort="low"),
        chat("Rome?", max_tokens=60, tools=[WEATHER_TOOL], tool_choice="required"),
        chat("Hello", max_tokens=40, reasoning_effort="low", stop=["nice"]),
        chat("Hey", max_tokens=40),
    ]
    (replies,) = compare_turns(plain, batched, bodies, turns=1)
    thinking, calling, stopped, raw = (r.json()["choices"][0] for r in replies)
    message = thinking["message"]
    assert (message["content"], message["reasoning_content"]) == (ANSWER_TEXT, THINK_TEXT)
    assert calling["finish_reason"] == "tool_calls"
    assert calling["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert stopped["message"]["content"] == "Paris is " and stopped["finish_reason"] == "stop"
    assert raw["message"]["content"] == ANSWER_TEXT
    assert metric(batched, "lmserve_lockstep_streams_total") == 8  # four blockers, four joined


def test_hang_ups_and_silent_readers_touch_only_their_stream(tmp_path):
    """In one batch: a client hangs up after its first frames, one reads nothing at all, two
    read normally. The two get their solo replies while the silent client's stream is still
    unread; the silent one then gets its whole stream; the hung-up one stopped generating."""
    server = start_lmserve(tmp_path, "--queue", "8", "--ctx", "1024", "--batch", "4")
    try:
        # --kv-slots (default 1) was raised to one per stream, and the RAM guard priced all four.
        assert server.health()["capabilities"]["kv_slots"] == 4
        assert "KV RAM guard: 4 slot(s)" in server.logs()
        run_isolation(server)
    finally:
        server.stop()


HANG_UP_BUDGET = 3000  # far above what the four blockers generate before they hang up


def run_isolation(server) -> None:
    silent_tokens = 200
    bodies = [
        {**endless(HANG_UP_BUDGET), "messages": [{"role": "user", "content": "Say something."}]},
        {**endless(silent_tokens), "stream_options": {"include_usage": True}},  # reads nothing
        chat("Name the capital city of France.", max_tokens=24),
        chat("Count to ten.", max_tokens=40, stop=["7"]),
    ]
    url = server.url + "/v1/chat/completions"
    solo = [httpx.post(url, json=body, timeout=600) for body in bodies[2:]]
    raw: dict[int, RawRequest] = {}

    def hold(i: int, body: dict) -> bool:
        if i < 2:
            raw[i] = RawRequest(server.url, "/v1/chat/completions", body, rcvbuf=4096)
        return i < 2

    before = server.health()["tokens_generated"]
    hanging, silent = None, None
    try:
        hanging_up = threading.Thread(target=_hang_up_after_frames, args=(lambda: raw.get(0), 3))
        hanging_up.start()
        replies = queued_together(server, bodies, hold)
        hanging, silent = raw[0], raw[1]
        hanging_up.join(600)
        for got, want in zip(replies[2:], solo, strict=True):
            # served beside the others, as alone (the repeat's prompt is cached, the reply the same)
            assert outcome(got)[:4] == outcome(want)[:4]
        assert silent.received == b""  # still unread while its siblings finished
        health = server.wait_idle(timeout=600)
        silent.read_all()
    finally:
        for request in (hanging, silent):
            if request is not None:
                request.close()
    frames = silent.frames()
    assert frames[-1] == "[DONE]"
    assert json.loads(frames[-2])["usage"]["completion_tokens"] == silent_tokens
    others = sum(outcome(r)[3] for r in replies[2:])
    # What the four blockers generated before they hung up counts too: a few hundred tokens.
    # Had the hung-up stream gone on, it would have spent its whole budget.
    rest = health["tokens_generated"] - before - silent_tokens - others
    assert rest < HANG_UP_BUDGET // 2, f"the hung-up stream and the blockers generated {rest} tokens"
    assert metric(server, "lmserve_lockstep_batches_total") == 1


def _hang_up_after_frames(request, frames: int) -> None:
    """Wait for the request to exist, read ``frames`` SSE frames, then close the socket."""
    deadline = time.monotonic() + 600
    while request() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    stream = request()
    stream.read_until(lambda got: count_frames(got) >= frames, timeout=600)
    stream.close()


def test_batch_with_spec_is_the_plain_server(tmp_path_factory):
    """``--batch 4 --spec``: a batch of four decodes plain, a request served alone speculates;
    both reply exactly as a plain ``--batch 1`` server does (greedy, stop strings, json_schema,
    a seeded sample, a reuse turn)."""
    from tests.api.test_spec_live import SPEC_LOG

    listing = "Repeat this list exactly: " + ", ".join(
        f"item {i} is {w}" for i, w in enumerate("red oak blue fir".split())
    )
    bodies = [
        chat(listing, max_tokens=40),
        chat("Name three colors.", max_tokens=24, stop=["."]),
        chat(
            "Invent a person.",
            max_tokens=40,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
        ),
        chat("Tell me a story.", max_tokens=24, temperature=0.8, seed=11),
    ]
    started = []
    try:
        for name, flags in (("plain", ("--batch", "1")), ("both", ("--batch", "4", "--spec"))):
            log_dir = tmp_path_factory.mktemp(f"spec-batch-{name}")
            started.append(start_lmserve(log_dir, *SMOLLM2_FLAGS, "--kv-slots", "5", *flags))
        plain, both = started
        compare_turns(plain, both, bodies, turns=2)
        assert metric(both, "lmserve_lockstep_batches_total") >= 2
        spec_runs = len(SPEC_LOG.findall(both.logs()))
        solo = chat(listing, max_tokens=40)
        want, got = (
            httpx.post(s.url + "/v1/chat/completions", json=solo, timeout=600) for s in (plain, both)
        )
        assert outcome(got) == outcome(want)
        # The lone request went through the speculative driver (its summary line is logged as
        # the stream ends). Whether drafts were verified is the cost gate's call on this
        # machine's measured verify costs, so that is not asserted here (test_spec_live does).
        deadline = time.monotonic() + 30
        while len(SPEC_LOG.findall(both.logs())) == spec_runs and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(SPEC_LOG.findall(both.logs())) == spec_runs + 1, both.logs()[-4000:]
    finally:
        for server in started:
            server.stop()
