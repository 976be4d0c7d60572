"""The server's warm-up leaves nothing for the first request to compile or load.

A fresh process used to pay for numba's kernels inside its first request (compiled on an
empty cache, else loaded from the disk cache: half a second of a 337-token prefill). The
worker's warm-up (backend.warm_up, Engine.warm_up for ``manage.py generate``) runs the
kernels first; these tests check that a long first request afterwards brings no numba
dispatcher a new signature and compiles nothing.
"""

from __future__ import annotations

import sys

import numba
import pytest

from inference.engine.engine import Engine
from inference.engine.jit.compile_watch import CompileWatch
from inference.generation.backend import ConversationBackend
from inference.generation.tokens import TokenGenerator
from inference.types import Finish, GenerationRequest, Message, SamplingOverrides
from tests.fixtures.model_files import default_model_path

pytestmark = pytest.mark.timeout(900)

# ~450 tokens: two prefill chunks (256 + the rest), the tiled attention of a long chunk, then decode.
LONG_PROMPT = " ".join(f"Item {i} of the list is the word w{i % 37}." for i in range(40))


def dispatcher_signatures() -> dict[str, int]:
    """Every numba dispatcher of the project's modules and how many signatures it holds
    (compiled here, or loaded from the disk cache: either is work a request would pay)."""
    found = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("inference"):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, numba.core.dispatcher.Dispatcher):
                found[f"{name}.{attr}"] = len(value.signatures)
    return found


class Events:
    """A sink that keeps what the request streamed."""

    cancelled = False

    def __init__(self):
        self.events = []

    def push(self, event) -> None:
        self.events.append(event)

    def close(self, final) -> None:
        self.events.append(final)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load(default_model_path())


def test_after_engine_warm_up_a_long_prefill_compiles_and_loads_nothing(engine):
    # First in the module: nothing has run the kernels in this process yet (run alone).
    engine.warm_up()
    before = dispatcher_signatures()
    prompt = engine.encode_prompt(LONG_PROMPT)
    loop = TokenGenerator(engine)
    with CompileWatch(lambda line: None, interval=3600) as watch:
        cache = engine.new_cache(1024)
        tokens = loop.run(cache, prompt, engine.recommended_sampling(), 4, ignore_eos=True).tokens
    assert len(tokens) == 4
    assert watch.compiled == 0
    assert dispatcher_signatures() == before


def test_after_the_server_warm_up_a_long_first_request_compiles_and_loads_nothing(engine):
    backend = ConversationBackend(engine, n_ctx=1024, kv_slots=1)
    backend.warm_up()
    backend.release()  # as the worker does after its warm-up
    before = dispatcher_signatures()
    assert any(before.values())  # the warm-up ran the kernels
    request = GenerationRequest(
        messages=(Message("user", LONG_PROMPT),), max_tokens=4, sampling=SamplingOverrides(temperature=0.0)
    )
    prepared = backend.validate(request)
    assert len(prepared.tokens) > 256  # more than one prefill chunk
    sink = Events()
    with CompileWatch(lambda line: None, interval=3600) as watch:
        backend.generate(request, prepared, sink)
    assert isinstance(sink.events[-1], Finish)
    assert watch.compiled == 0
    assert dispatcher_signatures() == before
