"""`lmserve --cartridge F` and fleet-style prefix serving, live, through the real SDKs.

The cartridges are untrained (fleet.cartridges.init): the model's own K/V of a system message
saying "The secret code is 4821.". By exactness, a greedy reply behind such a cartridge equals
the reply with that system message in the prompt at the same positions (computed here in
process, the server's arithmetic being the engine's), while the served prompt counts only the
real tokens. A second server composes two cartridges cut from one capture through a real
PrefixSource (tests/fixtures/prefix_sources.py) to test the documents header, sticky slots and
the adaptive switch.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from fleet.cartridges.file import Cartridge, save_cartridge
from fleet.cartridges.init import initial_cartridge
from inference.engine.engine import Engine
from inference.engine.sampler import SamplingParams
from inference.kv.disk import scan_sidecars
from inference.types import SamplingOverrides
from tests.api.conftest import ServerProcess, anthropic_client, openai_client, start_lmserve
from tests.fixtures.generation import generate_ids
from tests.fixtures.model_files import default_model_path

pytestmark = pytest.mark.slow

SECRET = {"role": "system", "content": "The secret code is 4821."}
ALPHA = {"role": "system", "content": "Alpha: the secret code is 4821."}
BETA = {"role": "system", "content": "Beta: the meeting is on Tuesday."}
INSTRUCTION = {"role": "system", "content": "Answer with the code only."}
QUESTION = {"role": "user", "content": "What is the secret code?"}
MAX_TOKENS = 12


class Prepared:
    """The cartridge files and the in-process references the tests compare with."""

    def __init__(self, engine: Engine, root):
        self.engine = engine
        self.root = root
        self.messages = [INSTRUCTION, QUESTION]
        self.prompt = engine.encode_chat(self.messages)
        secret = self.head([SECRET])
        self.secret_rows = len(secret)
        self.secret = save_cartridge(root / "secret.safetensors", initial_cartridge(engine, secret))
        whole = initial_cartridge(engine, self.head([ALPHA, BETA]))
        a = len(self.head([ALPHA]))
        self.doc_rows = {"alpha": a, "beta": whole.rows - a}
        self.docs = root / "docs"
        self.docs.mkdir()
        for name, rows in (("alpha", slice(0, a)), ("beta", slice(a, None))):
            part = Cartridge(whole.k[:, :, rows], whole.v[:, :, rows], whole.fingerprint, 0)
            save_cartridge(self.docs / f"{name}.safetensors", part)
        foreign = Cartridge(whole.k, whole.v, bytes(16), 1)
        self.foreign = save_cartridge(root / "foreign.safetensors", foreign)

    def head(self, systems: list[dict]) -> list[int]:
        """The tokens ``systems`` add in front of the served messages' own tokens."""
        full = self.engine.encode_chat([*systems, *self.messages])
        assert full[len(full) - len(self.prompt) :] == self.prompt  # a clean cut at a special token
        return full[: len(full) - len(self.prompt)]

    def reply(self, messages: list[dict]) -> str:
        """The greedy reply to ``messages`` with nothing cached, as the server samples it."""
        params: SamplingParams = SamplingOverrides(temperature=0.0).resolve(
            self.engine.recommended_sampling()
        )
        tokens = self.engine.encode_chat(messages)
        cache = self.engine.new_cache(len(tokens) + MAX_TOKENS + 1)
        out = b"".join(
            self.engine.tokenizer.token_bytes(t)
            for t in generate_ids(self.engine, cache, tokens, params, MAX_TOKENS)
        )
        return out.decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Prepared:
    return Prepared(Engine.load(default_model_path()), tmp_path_factory.mktemp("cartridges"))


@pytest.fixture(scope="module")
def cartridge_server(prepared, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("lmserve-cartridge")
    flags = ["--cartridge", str(prepared.secret), "--kv-slots", "1", "--ctx", "512"]
    proc = start_lmserve(log_dir, *flags, "--kv-cache-dir", str(log_dir / "kv"))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def docs_server(prepared, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("lmserve-docs")
    source = f"tests.fixtures.prefix_sources.TwoDocuments:{prepared.docs}"
    proc = start_lmserve(log_dir, "--prefix-source", source, "--kv-slots", "2", "--ctx", "512")
    yield proc
    proc.stop()


def chat(server: ServerProcess, messages: list[dict]):
    """A greedy Chat Completions reply and its raw response (for the headers)."""
    with openai_client(server, timeout=600) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=messages, temperature=0, max_tokens=MAX_TOKENS
        )
        return raw.parse(), raw


# -- one cartridge -----------------------------------------------------------------------------
def test_the_reply_behind_the_cartridge_is_the_reply_with_its_text_in_the_prompt(prepared, cartridge_server):
    want = prepared.reply([SECRET, *prepared.messages])
    reply, raw = chat(cartridge_server, prepared.messages)
    assert reply.choices[0].message.content == want
    assert reply.usage.prompt_tokens == len(prepared.prompt)  # the prefix rows are no prompt tokens
    assert "x-lmserve-documents" not in raw.headers
    # Anthropic Messages: the same conversation (system apart) gives the same reply and count.
    with anthropic_client(cartridge_server, timeout=600) as claude:
        message = claude.messages.create(
            model="m",
            system=INSTRUCTION["content"],
            messages=[QUESTION],
            max_tokens=MAX_TOKENS,
            extra_body={"temperature": 0},  # this SDK generation has no sampling arguments
        )
    assert "".join(b.text for b in message.content if b.type == "text") == want
    # Anthropic counts the cached part apart: the two add up to the real tokens, no prefix rows.
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == len(prepared.prompt)
    # Without the cartridge the model cannot know the code: the cartridge is what answers.
    assert prepared.reply(prepared.messages) != want


def test_health_names_the_cartridge(prepared, cartridge_server):
    assert cartridge_server.health()["cartridge"] == {
        "path": str(prepared.secret.resolve()),
        "rows": prepared.secret_rows,
    }


def test_a_follow_up_reuses_the_rows_past_the_prefix_and_a_disk_restore_keeps_it(prepared, cartridge_server):
    first, _ = chat(cartridge_server, prepared.messages)
    answer = first.choices[0].message.content
    follow_up = [
        *prepared.messages,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Again?"},
    ]
    second, _ = chat(cartridge_server, follow_up)
    n_follow_up = len(prepared.engine.encode_chat(follow_up))
    assert second.usage.prompt_tokens == n_follow_up
    assert len(prepared.prompt) - 1 <= second.usage.prompt_tokens_details.cached_tokens < n_follow_up
    assert second.choices[0].message.content == prepared.reply([SECRET, *follow_up])
    # One slot: an unrelated conversation spills this one to the disk tier...
    chat(cartridge_server, [{"role": "user", "content": "Name a colour."}])
    spilled = [s for s in scan_sidecars(cartridge_server.log_dir / "kv") if s["prefix_rows"]]
    assert spilled and all(s["prefix_rows"] == prepared.secret_rows for s in spilled)
    assert all(s["prefix_key"].startswith("cartridge:") for s in spilled)
    # ...and the follow-up comes back from it, behind the prefix it was saved with.
    again, _ = chat(cartridge_server, follow_up)
    assert again.usage.prompt_tokens_details.cached_tokens == n_follow_up - 1
    assert again.choices[0].message.content == second.choices[0].message.content


# -- start-up refusals -------------------------------------------------------------------------
def _refused(tmp_path, *flags: str) -> tuple[int, str]:
    proc = ServerProcess(["lmserve", "--port", "0", *flags], tmp_path)
    try:
        code = proc.process.wait(timeout=600)
    except subprocess.TimeoutExpired:
        proc.stop()
        raise
    return code, proc.logs()


def test_a_cartridge_of_another_model_is_refused_at_start_up(prepared, tmp_path):
    code, logs = _refused(tmp_path, "--cartridge", str(prepared.foreign))
    assert code != 0
    assert f"cartridge {prepared.foreign.resolve()}: built for the model with fingerprint {'00' * 16}" in logs


def test_a_cartridge_with_non_finite_rows_is_refused_naming_it(prepared, tmp_path):
    """400 bytes of 0xFF (NaNs) in the data of a cartridge of this very model: served, every
    greedy reply came out empty with finish_reason stop."""
    poisoned = tmp_path / "poisoned.safetensors"
    data = bytearray(prepared.secret.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")  # past the safetensors header
    data[start : start + 400] = b"\xff" * 400
    poisoned.write_bytes(bytes(data))
    code, logs = _refused(tmp_path, "--cartridge", str(poisoned))
    assert code != 0
    assert f"CommandError: {poisoned.resolve()}: 100 non-finite values (NaN or infinity)" in logs


def test_a_file_that_is_no_cartridge_is_refused_naming_it(tmp_path):
    from safetensors.numpy import save_file

    other = tmp_path / "weights.safetensors"
    save_file({"x": np.zeros(2, np.float32)}, str(other))  # safetensors, but no cartridge
    code, logs = _refused(tmp_path, "--cartridge", str(other))
    assert code != 0 and f"CommandError: {other}: not a cartridge" in logs
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    code, logs = _refused(tmp_path, "--cartridge", str(junk))
    assert code != 0 and f"{junk}: not a safetensors file" in logs
    code, logs = _refused(tmp_path, "--cartridge", str(tmp_path / "missing.safetensors"))
    assert code != 0 and "missing.safetensors: no such cartridge file" in logs


# -- composed prefixes (the fleet's serving side) ------------------------------------------------
def test_a_composition_cut_from_one_capture_is_the_joined_prefill(prepared, docs_server):
    reply, raw = chat(docs_server, [INSTRUCTION, {"role": "user", "content": "alpha beta: the code?"}])
    want = prepared.reply([ALPHA, BETA, INSTRUCTION, {"role": "user", "content": "alpha beta: the code?"}])
    assert raw.headers["x-lmserve-documents"] == "alpha,beta"
    assert reply.choices[0].message.content == want


def test_every_dialect_names_the_documents_streamed_or_not(docs_server):
    ask = [{"role": "user", "content": "Tell me about beta, then alpha."}]
    with openai_client(docs_server, timeout=600) as client:
        raw = client.chat.completions.with_raw_response.create(model="m", messages=ask, max_tokens=3)
        assert raw.headers["x-lmserve-documents"] == "beta,alpha"
        with client.chat.completions.with_streaming_response.create(
            model="m", messages=ask, max_tokens=3, stream=True
        ) as stream:
            assert stream.headers["x-lmserve-documents"] == "beta,alpha"
            assert "data: [DONE]" in stream.read().decode()
        raw = client.responses.with_raw_response.create(
            model="m", input="only beta please", max_output_tokens=3
        )
        assert raw.headers["x-lmserve-documents"] == "beta"
        with client.responses.with_streaming_response.create(
            model="m", input="only alpha please", max_output_tokens=3, stream=True
        ) as stream:
            assert stream.headers["x-lmserve-documents"] == "alpha"
            body = stream.read().decode()  # 3 tokens: the reply ends incomplete (max_output_tokens)
            assert "event: response.incomplete" in body
    with anthropic_client(docs_server, timeout=600) as claude:
        user = [{"role": "user", "content": "alpha, beta"}]
        raw = claude.messages.with_raw_response.create(model="m", messages=user, max_tokens=3)
        assert raw.headers["x-lmserve-documents"] == "alpha,beta"
        with claude.messages.with_streaming_response.create(
            model="m", messages=[{"role": "user", "content": "beta!"}], max_tokens=3, stream=True
        ) as stream:
            assert stream.headers["x-lmserve-documents"] == "beta"
            assert "message_stop" in stream.read().decode()


def _turn(server, history: list[dict], user: str):
    messages = [*history, {"role": "user", "content": user}]
    reply, raw = chat(server, messages)
    text = reply.choices[0].message.content
    cached = reply.usage.prompt_tokens_details.cached_tokens
    return [*messages, {"role": "assistant", "content": text}], raw.headers["x-lmserve-documents"], cached


def test_conversations_keep_their_selection_and_rows_until_a_switch(docs_server):
    x, docs_x, cached = _turn(docs_server, [], "About alpha: what is in it?")
    assert (docs_x, cached) == ("alpha", 0)
    y, docs_y, _ = _turn(docs_server, [], "And beta, then alpha?")
    assert docs_y == "beta,alpha"
    # Interleaved continuations: each keeps its selection (though they now name other
    # documents) and its slot's rows, through the composed prefix.
    x, docs_x, cached_x = _turn(docs_server, x, "Now tell me about beta.")
    y, docs_y, cached_y = _turn(docs_server, y, "Only alpha now.")
    assert (docs_x, docs_y) == ("alpha", "beta,alpha")
    assert cached_x > 10 and cached_y > 10
    # An adaptive switch rebuilds the prefix: nothing is cached that turn, the rows are new.
    x, docs_x, cached_x = _turn(docs_server, x, "switch: beta")
    assert (docs_x, cached_x) == ("beta", 0)
    x, docs_x, cached_x = _turn(docs_server, x, "More?")
    assert docs_x == "beta" and cached_x > 10


def test_health_carries_what_the_source_says_of_itself(prepared, docs_server):
    assert docs_server.health()["documents"] == prepared.doc_rows
