"""ConversationBackend behind a prefix source, on a synthetic model: the prefix takes room in
the context (a prompt it leaves no room for is a 400; the budget shrinks to what is left), the
documents reach the sink before any event, a failing source fails only its request, and usage
counts the real tokens only."""

from __future__ import annotations

import pytest

from fleet.cartridges.init import initial_cartridge
from inference.engine.engine import Engine
from inference.generation.backend import ConversationBackend
from inference.kv.prefix_source import PrefixChoice
from inference.types import Error, Finish, GenerationRequest, Message, SamplingOverrides
from tests.fixtures.synthetic_gguf import synthetic_path

N_CTX, ROWS = 64, 20
ASK = GenerationRequest((Message("user", "hello"),), SamplingOverrides(temperature=0.0), max_tokens=200)


class Sink:
    def __init__(self):
        self.events: list = []
        self.documents: tuple[str, ...] | None = None
        self.cancelled = False

    def prefix_chosen(self, documents) -> None:
        assert not self.events, "the documents come before any event"
        self.documents = tuple(documents)

    def push(self, event) -> None:
        self.events.append(event)

    def close(self, final) -> None:
        self.push(final)


class Named:
    """A real source: one cartridge, reported as a document; ``fail`` makes choose raise."""

    def __init__(self, choice: PrefixChoice):
        self.choice, self.fail = choice, False

    def check(self, engine) -> None:
        pass

    def choose(self, engine, request) -> PrefixChoice:
        if self.fail:
            raise RuntimeError("the index is gone")
        return self.choice


@pytest.fixture(scope="module")
def setup(synthetic_dir):
    engine = Engine.load(synthetic_path("llama", synthetic_dir))
    cartridge = initial_cartridge(engine, list(range(5, 5 + ROWS)))
    source = Named(PrefixChoice("doc:a", cartridge.prefix(), ("a",)))
    return ConversationBackend(engine, N_CTX, kv_slots=1, prefix_source=source), source


def test_the_prefix_takes_room_and_usage_counts_real_tokens(setup):
    backend, _ = setup
    prepared = backend.validate(ASK)
    sink = Sink()
    generated = backend.generate(ASK, prepared, sink)
    finish = sink.events[-1]
    assert sink.documents == ("a",)
    assert isinstance(finish, Finish) and finish.usage.prompt_tokens == len(prepared.tokens)
    # The budget validate allowed ignores the prefix; the worker cuts it to the rows left.
    assert prepared.max_tokens == N_CTX - len(prepared.tokens)
    assert generated <= N_CTX - ROWS - len(prepared.tokens)
    cache = backend.slots.slots[0].cache
    assert (cache.prefix_key, cache.prefix_rows) == ("doc:a", ROWS)
    assert cache.n_positions <= N_CTX


def test_a_prompt_the_prefix_leaves_no_room_for_is_a_400(setup):
    backend, _ = setup
    for n in range(1, 60):  # a prompt that fits the context, not beside the prefix
        long = GenerationRequest((Message("user", "word " * n),), max_tokens=5)
        prepared = backend.validate(long)
        if N_CTX - ROWS < len(backend.tokenize(long)) < N_CTX:
            break
    assert not isinstance(prepared, Error)
    sink = Sink()
    assert backend.generate(long, prepared, sink) == 0
    error = sink.events[-1]
    assert isinstance(error, Error) and error.status == 400 and error.code == "context_length_exceeded"
    assert error.overflow.n_ctx == N_CTX - ROWS
    assert f"maximum context length is {N_CTX - ROWS} tokens" in error.message


def test_a_failing_source_fails_its_request_only(setup):
    backend, source = setup
    source.fail = True
    try:
        sink = Sink()
        backend.generate(ASK, backend.validate(ASK), sink)
        assert isinstance(sink.events[-1], Error) and sink.events[-1].status == 500
        assert "choosing the KV prefix failed: RuntimeError: the index is gone" in sink.events[-1].message
    finally:
        source.fail = False
    sink = Sink()
    backend.generate(ASK, backend.validate(ASK), sink)
    assert isinstance(sink.events[-1], Finish)
