"""Two lmserve replicas behind nginx: follow-up-turn TTFT with conversation affinity versus
round-robin (docs/SCALING.md).

    .venv/bin/python bench/affinity.py [--model PATH] [--conversations 4] [--turns 4]

Starts two ``manage.py lmserve`` replicas on loopback (free ports) and one nginx (Debian's
``nginx`` package: ``apt-get install nginx``) in the foreground with two front ports: one whose
upstream hashes on the ``x-lmserve-conversation`` request header (consistent hashing), one
round-robin. The same workload runs through each: ``--conversations`` chats, each opening with
a long shared-nothing context, taking ``--turns`` turns in an interleaved order (turn 1 of
every chat, then turn 2 of every chat, ...), every turn streamed with ``max_tokens`` small.
Reported per front: the median and mean time to first token of follow-up turns (turn 2 on),
and the share of their prompt tokens the replica already held (``cached_tokens``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.api.conftest import start_lmserve  # noqa: E402  (the tests' server launcher)

NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    # A request without the header is spread by its request id instead of all hashing to "".
    map $http_x_lmserve_conversation $lmserve_affinity_key {{
        "" $request_id;
        default $http_x_lmserve_conversation;
    }}
    upstream lmserve_affinity {{
        hash $lmserve_affinity_key consistent;
{servers}
    }}
    upstream lmserve_round_robin {{
{servers}
    }}
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_set_header Host $host;  # lmserve answers only to the hosts it knows (--allowed-hosts)
    proxy_buffering off;
    proxy_request_buffering off;
    proxy_read_timeout 600s;
    server {{ listen 127.0.0.1:{affinity_port}; location / {{ proxy_pass http://lmserve_affinity; }} }}
    server {{ listen 127.0.0.1:{rr_port}; location / {{ proxy_pass http://lmserve_round_robin; }} }}
}}
"""


def nginx_config(directory: Path, replicas: list[str], affinity_port: int, rr_port: int) -> Path:
    """Write the nginx configuration (both fronts over ``replicas``, ``host:port`` each)."""
    servers = "\n".join(f"        server {r} max_fails=3 fail_timeout=10s;" for r in replicas)
    path = directory / "nginx.conf"
    path.write_text(
        NGINX_CONF.format(dir=directory, servers=servers, affinity_port=affinity_port, rr_port=rr_port)
    )
    return path


TOPICS = ["lighthouses", "bread baking", "glaciers", "chess openings", "honeybees", "tides", "volcanoes"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def context(topic: str, words: int) -> str:
    """A long first message, different for each conversation from its first token on."""
    sentence = f"Here are notes about {topic}, item {{i}}: {topic} are worth studying closely. "
    return f"[{topic}] " + "".join(sentence.format(i=i) for i in range(words // 12))


def turn(client: httpx.Client, base: str, conversation: str, messages: list, max_tokens: int) -> dict:
    """One streamed turn: the time to its first content delta, its reply and its usage."""
    body = {
        "model": "local",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"x-lmserve-conversation": conversation}
    started = time.perf_counter()
    first, text, usage = None, [], None
    with client.stream("POST", base + "/v1/chat/completions", json=body, headers=headers) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                piece = choice["delta"].get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
    return {"ttft": (first or time.perf_counter()) - started, "text": "".join(text), "usage": usage}


def workload(base: str, conversations: int, turns: int, words: int, max_tokens: int) -> list[dict]:
    """Interleaved chats through one front; the measurements of every follow-up turn."""
    chats = {
        f"chat-{i}": [{"role": "user", "content": context(TOPICS[i % len(TOPICS)], words)}]
        for i in range(conversations)
    }
    followups = []
    with httpx.Client(timeout=600) as client:
        for n in range(turns):
            for name, messages in chats.items():
                result = turn(client, base, name, messages, max_tokens)
                messages.append({"role": "assistant", "content": result["text"]})
                messages.append({"role": "user", "content": f"Tell me one more thing ({n + 1})."})
                if n > 0:
                    followups.append(result)
    return followups


def summary(followups: list[dict]) -> dict:
    ttfts = [r["ttft"] for r in followups]
    prompt = sum(r["usage"]["prompt_tokens"] for r in followups)
    cached = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in followups)
    return {
        "followup_turns": len(followups),
        "ttft_median_s": round(statistics.median(ttfts), 3),
        "ttft_mean_s": round(statistics.mean(ttfts), 3),
        "cached_share": round(cached / prompt, 3) if prompt else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="", help="GGUF for both replicas (default: the bundled model)")
    # Odd: with an even count, strict alternation would send each chat to the same replica.
    parser.add_argument("--conversations", type=int, default=5)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--words", type=int, default=1000, help="length of each chat's opening message")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--kv-slots", type=int, default=4, help="per replica")
    parser.add_argument("--ctx", type=int, default=3072)
    parser.add_argument("--nginx", default="/usr/sbin/nginx")
    args = parser.parse_args()
    if not Path(args.nginx).exists():
        sys.exit(f"no nginx at {args.nginx}: apt-get install nginx")

    results = {}
    for front in ("round_robin", "affinity"):
        followups = run_front(front, args)
        results[front] = summary(followups)
        print(front, json.dumps(results[front]), flush=True)
    print(json.dumps({"config": vars(args), "results": results}, indent=2))


def run_front(front: str, args) -> list[dict]:
    """Two fresh replicas (cold KV slots) behind a fresh nginx; the workload through ``front``."""
    work = Path(tempfile.mkdtemp(prefix=f"lmserve-{front}-"))
    flags = [*([args.model] if args.model else []), "--ctx", str(args.ctx), "--kv-slots", str(args.kv_slots)]
    replicas, nginx = [], None
    try:
        for name in ("a", "b"):
            (work / name).mkdir()
            replicas.append(start_lmserve(work / name, *flags))
        ports = {"affinity_port": free_port(), "rr_port": free_port()}
        config = nginx_config(work, [r.url.removeprefix("http://") for r in replicas], **ports)
        nginx = subprocess.Popen([args.nginx, "-p", str(work), "-c", str(config)])
        port = ports["affinity_port" if front == "affinity" else "rr_port"]
        wait_proxy(f"http://127.0.0.1:{port}")
        return workload(
            f"http://127.0.0.1:{port}", args.conversations, args.turns, args.words, args.max_tokens
        )
    finally:
        if nginx is not None:
            nginx.terminate()
            nginx.wait(10)
        for replica in replicas:
            replica.stop()


def wait_proxy(base: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"nginx did not answer on {base}")


if __name__ == "__main__":
    main()
