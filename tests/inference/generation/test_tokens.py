"""TokenGenerator: token-id prompts on a cache the caller holds, through the server's loop."""

from __future__ import annotations

import pytest

from inference.engine.engine import Engine
from inference.engine.sampler import SamplingParams
from inference.generation.tokens import TokenGenerator
from inference.types import Error, Finish, TextDelta
from tests.fixtures.synthetic_gguf import synthetic_path


@pytest.fixture(scope="module")
def loop(synthetic_dir) -> TokenGenerator:
    return TokenGenerator(Engine.load(synthetic_path("llama", synthetic_dir)))


def prompt_of(loop: TokenGenerator) -> list[int]:
    return loop.engine.encode_prompt("one two three four five six")


def test_a_run_reports_its_tokens_text_and_finish_and_resumes_from_the_cache(loop):
    engine, prompt = loop.engine, prompt_of(loop)
    streamed: list[str] = []
    cache = engine.new_cache(128)
    run = loop.run(cache, prompt, SamplingParams(), 12, ignore_eos=True, on_text=streamed.append)
    assert len(run.tokens) == 12 and run.final == Finish("length", run.final.usage)
    assert run.final.usage.prompt_tokens == len(prompt) and run.final.usage.completion_tokens == 12
    text = "".join(e.text for e in run.events if isinstance(e, TextDelta))
    assert "".join(streamed) == text == engine.tokenizer.decode(run.tokens)
    # The cache keeps the prompt and the reply (but its last token): the same prompt again
    # prefills nothing, and gives the same greedy reply.
    assert cache.tokens == prompt + run.tokens[:-1]
    again = loop.run(cache, prompt, SamplingParams(), 12, ignore_eos=True)
    assert again.tokens == run.tokens and again.stats.cached_tokens == len(prompt)


def test_a_prompt_the_cache_cannot_hold_ends_the_run_with_an_error_and_an_empty_cache(loop):
    prompt = prompt_of(loop)
    cache = loop.engine.new_cache(len(prompt) - 1)
    run = loop.run(cache, prompt, SamplingParams(), 4)
    assert run.tokens == [] and isinstance(run.final, Error) and run.final.status == 500
    assert "ContextFullError" in run.final.message and "context is full" in run.final.message
    assert cache.n_tokens == 0  # rows a failed forward may have written are not kept


def test_stopping_early_ends_the_run_without_a_finish(loop):
    run = loop.run(
        loop.engine.new_cache(128), prompt_of(loop), SamplingParams(), 30, ignore_eos=True, stop_after=5
    )
    assert len(run.tokens) == 5 and run.final is None
