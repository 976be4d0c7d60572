"""Live disk tier: evict -> spill -> restore, torn and corrupted sidecars, files of an earlier run
(and the temporary a run killed mid-spill leaves).

With one slot, an unrelated request destroys the conversation's cache; the server spills it to a
sidecar first and restores it when the conversation comes back. The follow-up must report the
whole conversation as cached and decode exactly what a server that never evicted decodes: both
prefill the same new tokens onto the same f16 rows (a follow-up is never wholly cached, so
neither server starts from saved logits).
"""

from __future__ import annotations

import shutil
import uuid

import httpx
import pytest

from inference.kv.sidecar import COUNT_OFFSET, open_sidecar

from .test_kv_slots import chat, chat_usage, long_system_prompt

pytestmark = pytest.mark.slow  # a live server or a real model's long run

BASE_FLAGS = ["--kv-slots", "1", "--ctx", "2048"]
QUESTION_A = "Here are my notes. " + long_system_prompt(160, seed=1) + " Which word is first?"
QUESTION_B = "Other notes. " + long_system_prompt(160, seed=2) + " Which word is last?"


def first_turn() -> list[dict]:
    return [{"role": "user", "content": QUESTION_A}]


def follow_up(reply: dict) -> list[dict]:
    content = reply["choices"][0]["message"]["content"]
    return [*first_turn(), {"role": "assistant", "content": content}, {"role": "user", "content": "Why?"}]


def client(server) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=600)


def spill_conversation_a(server) -> dict:
    """Serve A's first turn, then an unrelated request that evicts (and spills) it."""
    with client(server) as http:
        first = chat(http, first_turn(), max_tokens=12)
        chat(http, [{"role": "user", "content": QUESTION_B}], max_tokens=4)
    return first


def test_evict_spill_restore_matches_a_server_that_never_evicted(start_server, tmp_path):
    disk = tmp_path / "kv"
    server = start_server(*BASE_FLAGS, "--kv-cache-dir", str(disk), "--kv-disk-slots", "4")
    first = spill_conversation_a(server)
    assert len(list(disk.glob("*.kv"))) == 1
    with client(server) as http:
        restored = chat(http, follow_up(first), max_tokens=24)
    prompt1, completion1, _ = chat_usage(first)
    _, _, cached = chat_usage(restored)
    assert cached >= prompt1 + completion1 - 2
    assert "restored a" in server.logs()

    control = start_server(*BASE_FLAGS)
    with client(control) as http:
        assert chat(http, first_turn(), max_tokens=12)["choices"] == first["choices"]
        never_evicted = chat(http, follow_up(first), max_tokens=24)
    assert chat_usage(never_evicted)[2] == cached
    assert restored["choices"][0]["message"]["content"]
    assert never_evicted["choices"][0]["message"] == restored["choices"][0]["message"]


def test_sidecars_of_an_earlier_run_torn_or_corrupted(start_server, tmp_path):
    disk = tmp_path / "kv"
    server = start_server(*BASE_FLAGS, "--kv-cache-dir", str(disk))
    first = spill_conversation_a(server)
    server.stop()
    (path,) = disk.glob("*.kv")
    header, records = open_sidecar(path)
    record_bytes, header_bytes = header.record_dtype.itemsize, header.size
    del records
    corrupt = disk / "corrupt.kv"
    shutil.copy(path, corrupt)
    data = bytearray(corrupt.read_bytes())
    data[COUNT_OFFSET + 4] ^= 0x40  # a fingerprint byte: the header checksum no longer matches
    corrupt.write_bytes(bytes(data))
    valid = 100
    stale = disk / f".{uuid.uuid4().hex}.kv.tmp"  # what a kill -9 in the middle of a spill leaves
    stale.write_bytes(path.read_bytes()[: header_bytes + 3 * record_bytes])
    (disk / "notes.tmp").write_text("not the server's")
    with path.open("r+b") as f:
        f.truncate(header_bytes + valid * record_bytes + record_bytes // 2)  # cut inside record 101

    again = start_server(*BASE_FLAGS, "--kv-cache-dir", str(disk))
    assert "ignoring KV sidecar corrupt.kv: corrupted header" in again.logs()
    removed = f"removed 1 stale KV sidecar temporary ({header_bytes + 3 * record_bytes} bytes) left by"
    assert f"{removed} an interrupted spill in {disk}: {stale.name}" in again.logs()
    assert not stale.exists() and (disk / "notes.tmp").exists()
    with client(again) as http:
        reply = chat(http, follow_up(first), max_tokens=4)
    assert chat_usage(reply)[2] == valid
