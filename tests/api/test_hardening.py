"""What fault probes found, checked on live servers: bodies refused before they are read, lone
surrogates, non-JSON content types, foreign Host headers, the admin under --api-key."""

from __future__ import annotations

import re
import socket
import time
from urllib.parse import urlparse

import httpx
import pytest

from .conftest import API_KEY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HI = [{"role": "user", "content": "Hi"}]
JSON = {"content-type": "application/json"}
AUTH = {"authorization": f"Bearer {API_KEY}", **JSON}


def rss_mib(pid: int) -> int:
    status = open(f"/proc/{pid}/status").read()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) // 1024


def open_upload(url: str, head: dict[str, str]) -> socket.socket:
    """A POST whose head is sent and whose body is up to the caller."""
    address = urlparse(url)
    sock = socket.create_connection((address.hostname, address.port), timeout=10)
    lines = [
        "POST /v1/chat/completions HTTP/1.1",
        f"Host: {address.hostname}",
        *(f"{k}: {v}" for k, v in head.items()),
    ]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return sock


def read_answer(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split()[1]), body


def test_a_declared_oversized_body_is_refused_before_any_of_it_is_sent(idle_server):
    started = time.perf_counter()
    sock = open_upload(idle_server.url, {**AUTH, "Content-Length": str(1 << 30)})
    status, body = read_answer(sock)  # no body byte sent: the head alone decides
    sock.close()
    assert status == 413 and b"request_too_large" in body
    assert time.perf_counter() - started < 5


def test_a_401_does_not_wait_for_the_upload(idle_server):
    sock = open_upload(idle_server.url, {**JSON, "Content-Length": str(4 << 20)})
    status, body = read_answer(sock)
    sock.close()
    assert status == 401 and b"missing API key" in body


def test_a_chunked_upload_is_cut_off_as_it_passes_the_limit(idle_server):
    pid = idle_server.process.pid
    before = rss_mib(pid)
    sock = open_upload(idle_server.url, {**AUTH, "Transfer-Encoding": "chunked"})
    block = b"x" * (1 << 20)
    sent = 0
    sock.settimeout(0.5)
    answer = None
    while sent < 1 << 30 and answer is None:
        try:
            sock.sendall(b"%x\r\n" % len(block) + block + b"\r\n")
            sent += len(block)
        except (TimeoutError, OSError):
            pass  # the server stopped reading or closed: the answer is waiting
        sock.setblocking(False)
        try:
            answer = sock.recv(65536) or None
        except BlockingIOError:
            pass
        sock.settimeout(0.5)
    sock.close()
    assert answer is not None and answer.startswith(b"HTTP/1.1 413"), answer
    assert sent < 64 << 20  # an 8 MiB limit, plus what the socket buffers held
    assert rss_mib(pid) - before < 64
    assert idle_server.health()["status"] == "ok"


ESCAPED = b'"a\\ud800b"'
RAW = b'"a\xed\xa0\x80b"'


@pytest.mark.parametrize("text", [ESCAPED, RAW], ids=["escaped", "raw-bytes"])
@pytest.mark.parametrize(
    ("path", "template", "param"),
    [
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": %s}]}', "messages[0].content"),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "system", "content": [{"type": "text", "text": %s}]}, '
            b'{"role": "user", "content": "hi"}]}',
            "messages[0].content[0].text",
        ),
        ("/v1/responses", b'{"input": %s}', "input"),
        ("/v1/responses", b'{"input": "hi", "instructions": %s}', "instructions"),
        (
            "/v1/messages",
            b'{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": %s}]}',
            None,
        ),
        ("/v1/messages", b'{"model": "m", "max_tokens": 4, "system": %s, "messages": []}', None),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(http, path, template, param, text):
    r = http.post(path, content=template % text)
    assert r.status_code == 400, r.text
    body = r.json()
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert "'messages[0].content'" in body["error"]["message"] or "'system'" in body["error"]["message"]
        assert "surrogate" in body["error"]["message"]
    else:
        assert body["error"]["param"] == param and param in body["error"]["message"]


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
def test_json_endpoints_refuse_other_content_types_with_415(idle_server, content_type):
    headers = {"authorization": f"Bearer {API_KEY}"}
    if content_type:
        headers["content-type"] = content_type
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/messages"):
        r = httpx.post(idle_server.url + path, content=b'{"messages": []}', headers=headers)
        assert r.status_code == 415, (path, r.text)
        text = r.text
        assert "application/json" in text and (content_type or "no Content-Type").split(";")[0] in text


def test_json_with_a_charset_is_json(http):
    r = http.post(
        "/v1/chat/completions",
        json={"messages": HI, "max_tokens": 1},
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert r.status_code == 200


def test_foreign_host_headers_are_refused_on_every_path(idle_server):
    port = urlparse(idle_server.url).port
    for path in ("/health", "/v1/models", "/admin/login/", "/static/admin/css/base.css"):
        r = httpx.get(idle_server.url + path, headers={"host": f"rebound.example:{port}", **AUTH})
        assert r.status_code == 400 and r.json()["error"]["code"] == "disallowed_host", path
        assert "--allowed-hosts" in r.json()["error"]["message"]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost"):
        assert httpx.get(idle_server.url + "/health", headers={"host": host}).status_code == 200


def test_allowed_hosts_widens_the_list(start_server):
    server = start_server("--allowed-hosts", "lmserve.test,.lan.example", "--ctx", "256")
    port = urlparse(server.url).port
    for host in ("lmserve.test", f"box.lan.example:{port}", "localhost"):
        assert httpx.get(server.url + "/health", headers={"host": host}).status_code == 200, host
    assert httpx.get(server.url + "/health", headers={"host": "other.test"}).status_code == 400


def test_the_admin_uses_its_own_login_not_the_api_key(idle_server):
    """Decided: --api-key guards the API; /admin/ is guarded by Django's staff login (a
    browser cannot attach a bearer key to a page visit), so the key neither opens nor closes it."""
    url = idle_server.url
    assert httpx.get(url + "/v1/models").status_code == 401
    for headers in ({}, {"authorization": f"Bearer {API_KEY}"}):
        r = httpx.get(url + "/admin/kv/", headers=headers)
        assert r.status_code == 302 and r.headers["location"].startswith("/admin/login/")
    login = httpx.get(url + "/admin/login/")
    assert login.status_code == 200 and "csrfmiddlewaretoken" in login.text
