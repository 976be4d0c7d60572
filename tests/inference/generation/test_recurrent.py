"""The recurrent family's backend (the conversation loop over fresh caches) on the synthetic
Qwen3.5 file: a fresh cache per request (nothing cached, the same reply twice), the
prompt-prefilled think opener routed as reasoning, thinking off under a grammar, and the flags
it cannot honour refused by name."""

from __future__ import annotations

import pytest

from inference.engine.engine import Engine
from inference.generation.backend import ConversationBackend
from inference.generation.backends import BackendSetup, backend_for
from inference.generation.constraints import ConstraintSpec
from inference.generation.recurrent import FreshCaches
from inference.types import (
    Error,
    Finish,
    GenerationRequest,
    Message,
    ReasoningDelta,
    SamplingOverrides,
    TextDelta,
)
from tests.fixtures.generation import greedy_text
from tests.fixtures.synthetic_qwen35 import qwen35_path
from tests.inference.generation.test_backend import RecordingSink

pytestmark = pytest.mark.timeout(600)
GREEDY = SamplingOverrides(temperature=0.0)
ASK = (Message("user", "What is the capital of France?"),)


@pytest.fixture(scope="module")
def engine(synthetic_dir) -> Engine:
    return Engine.load(qwen35_path("qwen35", synthetic_dir))


@pytest.fixture(scope="module")
def backend(engine) -> ConversationBackend:
    chosen = backend_for(BackendSetup(engine, n_ctx=128))
    assert isinstance(chosen.caches, FreshCaches)  # the conversation loop, composed with fresh caches
    return chosen


def run(backend, request: GenerationRequest) -> tuple[list[int], RecordingSink]:
    prepared = backend.validate(request)
    assert not isinstance(prepared, Error), prepared
    sink = RecordingSink()
    backend.generate(request, prepared, sink)
    assert isinstance(sink.events[-1], Finish), sink.events[-1]
    return prepared.tokens, sink


def greedy_reply(engine: Engine, prompt: list[int], n: int) -> str:
    return greedy_text(engine, prompt, n)[1]


def test_the_backend_keeps_nothing_between_requests(backend):
    assert backend.capabilities.kv_reuse is False and backend.slots is None
    assert not backend.capabilities.batch  # the worker serves its jobs one at a time
    request = GenerationRequest(ASK, GREEDY, max_tokens=6)
    _, first = run(backend, request)
    _, again = run(backend, request)
    assert first.events == again.events  # the same reply from the same (empty) start
    assert first.events[-1].usage.cached_tokens == 0 and again.events[-1].usage.cached_tokens == 0


def test_the_prefilled_think_opener_routes_the_reply_as_reasoning(backend, engine):
    prompt, sink = run(backend, GenerationRequest(ASK, GREEDY, max_tokens=6, reasoning=True))
    assert engine.tokenizer.decode(prompt).endswith("<|im_start|>assistant\n<think>\n")
    reasoning = "".join(e.text for e in sink.events if isinstance(e, ReasoningDelta))
    assert reasoning == greedy_reply(engine, prompt, 6) and sink.text == ""
    usage = sink.events[-1].usage
    assert usage.reasoning_tokens == usage.completion_tokens == 6
    # What the model writes after its own closing marker is the reply.
    one = GenerationRequest(ASK, GREEDY, max_tokens=1, reasoning=True)
    stream = backend.open_stream(one, backend.validate(one), RecordingSink())
    events = stream.emitter.feed(b" so.</think>\n\nParis.") + stream.emitter.flush()
    assert events == [ReasoningDelta(" so."), TextDelta("Paris.")]


def test_reasoning_off_renders_the_empty_think_block(backend, engine):
    prompt, sink = run(backend, GenerationRequest(ASK, GREEDY, max_tokens=6))
    assert engine.tokenizer.decode(prompt).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not any(isinstance(e, ReasoningDelta) for e in sink.events)
    assert sink.text == greedy_reply(engine, prompt, 6)


def test_a_grammar_governs_the_reply_from_its_first_token(backend, engine):
    spec = ConstraintSpec("lark", 'start: "Paris" | "Lyon" | "Nice"', "lark")
    prompt, sink = run(backend, GenerationRequest(ASK, GREEDY, max_tokens=8, reasoning=True, constraint=spec))
    assert engine.tokenizer.decode(prompt).endswith("<think>\n\n</think>\n\n")  # thinking off
    assert not any(isinstance(e, ReasoningDelta) for e in sink.events)
    assert sink.text in ("Paris", "Lyon", "Nice") and sink.events[-1].reason == "stop"


def test_flags_that_need_a_cut_back_cache_are_refused(engine):
    with pytest.raises(ValueError, match="^--spec is not supported for the qwen35 family: its recurrent"):
        backend_for(BackendSetup(engine, n_ctx=64, spec=True))
    with pytest.raises(ValueError, match="--spec is not .*; --kv-cache-dir is not supported"):
        backend_for(BackendSetup(engine, n_ctx=64, disk=object(), spec=True))
    with pytest.raises(ValueError, match="--cartridge / --fleet .*cannot run behind a KV prefix"):
        backend_for(BackendSetup(engine, n_ctx=64, prefix_source=object()))
    with pytest.raises(ValueError, match="--batch 2 is not supported .*serves one request at a time"):
        backend_for(BackendSetup(engine, n_ctx=64, batch=2))


def test_an_engine_failure_ends_the_request_with_a_500(backend, monkeypatch):
    def broken(cache, token):
        raise RuntimeError("boom")

    monkeypatch.setattr(backend.engine, "decode_one", broken)
    request = GenerationRequest(ASK, GREEDY, max_tokens=4)
    sink = RecordingSink()
    assert (
        backend.generate(request, backend.validate(request), sink) == 1
    )  # the first token came from the prefill
    final = sink.events[-1]
    assert isinstance(final, Error) and final.status == 500 and "boom" in final.message
