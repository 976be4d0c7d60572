"""The block-diffusion backend on the synthetic DiffusionGemma file: chosen by the family,
what it refuses (400s naming the parameter), the budget in whole canvases, one text delta per
committed block, and seeded replies that repeat."""

from __future__ import annotations

import pytest

from inference.engine.diffusion_sampler import generate_blocks
from inference.engine.engine import Engine
from inference.generation.backends import BackendSetup, backend_for
from inference.generation.constraints import ConstraintSpec
from inference.generation.diffusion import DiffusionBackend
from inference.types import (
    Error,
    Finish,
    GenerationRequest,
    LogprobsRequest,
    Message,
    SamplingOverrides,
    TextDelta,
)
from tests.fixtures.synthetic_diffusion_gemma import CANVAS, diffusion_gemma_path
from tests.inference.generation.test_backend import RecordingSink, run

HELLO = (Message("user", "Say hello."),)
SEEDED = SamplingOverrides(seed=7)
JSON_OBJECT = ConstraintSpec.json_schema({"type": "object"}, "response_format")


@pytest.fixture(scope="module")
def engine(synthetic_dir) -> Engine:
    return Engine.load(diffusion_gemma_path(synthetic_dir))


@pytest.fixture(scope="module")
def backend(engine) -> DiffusionBackend:
    return backend_for(BackendSetup(engine, n_ctx=256))


def test_the_family_picks_the_diffusion_backend(backend):
    assert isinstance(backend, DiffusionBackend)
    assert backend.slots is None
    can = backend.capabilities
    assert not (can.kv_reuse or can.tools or can.reasoning or can.grammar or can.batch or can.spec)


@pytest.mark.parametrize(
    "request_, param",
    [
        (GenerationRequest(HELLO, constraint=JSON_OBJECT), "response_format"),
        (GenerationRequest(HELLO, stop=("\n",)), "stop"),
        (GenerationRequest(HELLO, stop=("\n",), stop_param="stop_sequences"), "stop_sequences"),
        (GenerationRequest(HELLO, ignore_eos=True), "ignore_eos"),
        (GenerationRequest(HELLO, logprobs=LogprobsRequest(2, "logprobs")), "logprobs"),
        (GenerationRequest(HELLO, logprobs=LogprobsRequest(0, "include")), "include"),
    ],
)
def test_what_a_denoiser_cannot_honour_is_a_400_naming_it(backend, request_, param):
    refused = backend.validate(request_)
    assert isinstance(refused, Error) and refused.status == 400
    assert refused.param == param and f"'{param}'" in refused.message


def test_sampling_fields_other_than_seed_are_accepted_and_ignored(backend):
    # The reference server maps only the seed: the temperature schedule is the model's own.
    plain = backend.validate(GenerationRequest(HELLO))
    tuned = backend.validate(GenerationRequest(HELLO, sampling=SamplingOverrides(temperature=0.5, top_p=0.9)))
    assert not isinstance(tuned, Error) and tuned.tokens == plain.tokens


def test_the_budget_is_whole_canvases_after_the_prompt(engine, backend):
    prompt = backend.validate(GenerationRequest(HELLO))
    assert prompt.max_tokens == (256 - len(prompt.tokens)) // CANVAS * CANVAS
    assert backend.validate(GenerationRequest(HELLO, max_tokens=5)).max_tokens == 5
    tight = DiffusionBackend(engine, n_ctx=len(prompt.tokens) + CANVAS - 1)
    overflow = tight.validate(GenerationRequest(HELLO))
    assert isinstance(overflow, Error) and overflow.code == "context_length_exceeded"
    assert f"{CANVAS}-token canvas" in overflow.message


@pytest.mark.slow
def test_one_delta_per_committed_block_and_a_seed_repeats_the_reply(engine, backend):
    request = GenerationRequest(HELLO, sampling=SEEDED, max_tokens=CANVAS + 8)
    sink, produced = run(backend, request)
    deltas = [e.text for e in sink.events if isinstance(e, TextDelta)]
    finish = sink.events[-1]
    assert isinstance(finish, Finish) and finish.usage.completion_tokens == produced
    # The blocks the sampler commits for this prompt and seed, run directly.
    prompt = backend.validate(request)
    blocks = list(
        generate_blocks(
            engine.model, engine.new_cache(256), prompt.tokens, prompt.max_tokens, engine.stop_ids, 7
        )
    )
    assert produced == sum(len(b.tokens) for b in blocks)
    assert finish.reason == ("stop" if blocks[-1].finished else "length")
    texts = [
        b"".join(engine.tokenizer.token_bytes(t) for t in b.tokens).decode("utf-8", "replace") for b in blocks
    ]
    assert len(deltas) == len([t for t in texts if t]) and len(blocks) == 2  # 40 tokens: 32 + 8
    assert "".join(deltas) == "".join(texts)
    again, _ = run(backend, request)
    assert [e.text for e in again.events if isinstance(e, TextDelta)] == deltas
    other, _ = run(
        backend, GenerationRequest(HELLO, sampling=SamplingOverrides(seed=8), max_tokens=CANVAS + 8)
    )
    assert [e.text for e in other.events if isinstance(e, TextDelta)] != deltas


def test_a_hang_up_stops_after_the_block_in_hand(backend):
    sink = RecordingSink(cancel_after=1)
    _, produced = run(backend, GenerationRequest(HELLO, sampling=SEEDED, max_tokens=3 * CANVAS), sink)
    assert produced == CANVAS and len(sink.events) == 1  # one block, no Finish: the client left


def test_flags_it_cannot_honour_are_refused_at_start_up(engine):
    with pytest.raises(ValueError, match="cannot run behind a KV prefix"):
        backend_for(BackendSetup(engine, n_ctx=256, prefix_source=object()))
    # Each of these was once accepted and silently unused.
    for setup, flag in (
        (BackendSetup(engine, n_ctx=256, spec=True), "--spec"),
        (BackendSetup(engine, n_ctx=256, batch=2), "--batch 2"),
        (BackendSetup(engine, n_ctx=256, disk=object()), "--kv-cache-dir"),
    ):
        with pytest.raises(ValueError, match=f"^{flag} is not supported for the diffusion-gemma family"):
            backend_for(setup)
