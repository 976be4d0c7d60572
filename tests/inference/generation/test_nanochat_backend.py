"""The nanochat backend: its calculator (Python's own results for nanochat's two forms, None
where nanochat gives none), the chat protocol it builds, what it refuses, and the decode loop:
forced calculator output, the terminal tokens, stop strings, the budget and cancellation. The
loop runs over a scripted model whose argmax follows a script, so each path is reached on
purpose; the real model's replies are checked live (tests/api/test_nanochat_live.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inference.engine.nanochat_checkpoint import NanochatCheckpoint
from inference.engine.tokenizer.nanochat_bpe import NanochatTokenizer
from inference.generation.constraints import ConstraintSpec
from inference.generation.nanochat import NanochatBackend
from inference.generation.nanochat_tools import CalculatorState, use_calculator
from inference.types import (
    Error,
    Finish,
    GenerationRequest,
    LogprobsRequest,
    Message,
    SamplingOverrides,
    TextDelta,
)
from tests.fixtures.synthetic_nanochat import tokenizer_file
from tests.inference.generation.test_backend import RecordingSink


@pytest.mark.parametrize(
    "expr, result",
    [
        ("2+3*4", "14"),
        ("(2+3)*4", "20"),
        ("-3+5", "2"),
        ("1,000+1", "1001"),  # commas stripped
        ("10/2", "5.0"),  # true division: a float
        ("7-2-2", "3"),
        ("0.1+0.2", "0.30000000000000004"),  # Python's float repr
        ("2**3", None),  # power refused
        ("1/0", None),
        ("2 3", None),  # a syntax error
        ("'a'.count('a')", "1"),
        ("'hello world'.count('o')", "2"),
        ("'aaaa'.count('aa')", "2"),  # non-overlapping
        ("\"ab\".count('')", "3"),
        ("'__x'.count('_')", None),  # a dangerous pattern
        ("'a'.strip()", None),  # only .count
        ("open('x')", None),
        ("x+1", None),  # a name
    ],
)
def test_calculator(expr, result):
    assert use_calculator(expr) == result


@pytest.fixture(scope="module")
def tok() -> NanochatTokenizer:
    return NanochatTokenizer(tokenizer_file())


class ScriptedModel:
    """A stand-in for NanochatModel: each forward's last row has its peak at the next id of
    the script; it records every chunk it was fed."""

    def __init__(self, script: list[int], vocab: int):
        self.script, self.vocab, self.fed = list(script), vocab, []

    def new_cache(self, capacity: int):
        return object()

    def forward(self, cache, ids):
        self.fed.append(list(ids))
        logits = np.zeros((len(ids), self.vocab), dtype=np.float32)
        logits[-1, self.script.pop(0) if self.script else 0] = 10.0
        return logits


def make_backend(tok, script=(), n_ctx=256) -> NanochatBackend:
    model = ScriptedModel(list(script), tok.n_vocab)
    return NanochatBackend(NanochatCheckpoint(Path("scripted"), model, tok), n_ctx)


def greedy(*messages, max_tokens=None, stop=(), **fields) -> GenerationRequest:
    return GenerationRequest(
        messages=tuple(messages),
        sampling=SamplingOverrides(temperature=0.0),
        max_tokens=max_tokens,
        stop=stop,
        **fields,
    )


def run(backend, request) -> RecordingSink:
    prompt = backend.validate(request)
    assert not isinstance(prompt, Error), prompt
    sink = RecordingSink()
    backend.generate(request, prompt, sink)
    return sink


def test_the_prompt_is_nanochats_protocol(tok):
    s = tok.special_id
    backend = make_backend(tok)
    request = greedy(Message("user", "Hi"), Message("assistant", "Hello"), Message("user", "2+2?"))
    assert backend.tokenize(request) == [
        s("<|bos|>"),
        s("<|user_start|>"),
        *tok.encode("Hi"),
        s("<|user_end|>"),
        s("<|assistant_start|>"),
        *tok.encode("Hello"),
        s("<|assistant_end|>"),
        s("<|user_start|>"),
        *tok.encode("2+2?"),
        s("<|user_end|>"),
        s("<|assistant_start|>"),
    ]


def test_calculator_markers_are_tokens_in_assistant_turns_only(tok):
    s = tok.special_id
    backend = make_backend(tok)
    said = "<|python_start|>2+2<|python_end|><|output_start|>4<|output_end|>So 4."
    tokens = backend.tokenize(
        greedy(Message("user", said), Message("assistant", said), Message("user", "ok"))
    )
    user_part = tokens[2 : tokens.index(s("<|user_end|>"))]
    assert user_part == tok.encode(said)  # a user's text never becomes a special token
    start = tokens.index(s("<|assistant_start|>")) + 1
    assistant_part = tokens[start : tokens.index(s("<|assistant_end|>"))]
    assert assistant_part == [
        s("<|python_start|>"),
        *tok.encode("2+2"),
        s("<|python_end|>"),
        s("<|output_start|>"),
        *tok.encode("4"),
        s("<|output_end|>"),
        *tok.encode("So 4."),
    ]


def test_a_prefill_continues_the_assistant_turn(tok):
    tokens = make_backend(tok).tokenize(greedy(Message("user", "Hi"), prefill="Sure"))
    assert tokens[-len(tok.encode("Sure")) - 1 :] == [
        tok.special_id("<|assistant_start|>"),
        *tok.encode("Sure"),
    ]


@pytest.mark.parametrize("role, named", [("system", "no system role"), ("tool", "no 'tool' role")])
def test_roles_nanochat_lacks_are_400s(tok, role, named):
    error = make_backend(tok).validate(greedy(Message(role, "x"), Message("user", "Hi")))
    assert isinstance(error, Error) and error.status == 400 and error.param == "messages"
    assert named in error.message and error.message.startswith("messages[0]")


def test_a_grammar_is_a_400_naming_it(tok):
    request = greedy(Message("user", "Hi"), constraint=ConstraintSpec("regex", "[a-z]+", "regex"))
    error = make_backend(tok).validate(request)
    assert isinstance(error, Error) and error.status == 400 and error.param == "regex"
    assert "grammar" in error.message


def test_logprobs_are_a_400_naming_the_field(tok):
    request = greedy(Message("user", "Hi"), logprobs=LogprobsRequest(3, "top_logprobs"))
    error = make_backend(tok).validate(request)
    assert isinstance(error, Error) and error.status == 400 and error.param == "top_logprobs"


def test_a_prompt_filling_the_context_is_a_400(tok):
    error = make_backend(tok, n_ctx=8).validate(greedy(Message("user", "What is the capital of France?")))
    assert isinstance(error, Error) and error.code == "context_length_exceeded"


def test_the_calculator_output_is_forced_into_the_reply(tok):
    s = tok.special_id
    junk = tok.encode("x")[0]  # what the model would say instead of the forced tokens
    script = [s("<|python_start|>"), *tok.encode("2+3"), s("<|python_end|>"), junk, junk, junk]
    script += [*tok.encode("Done"), s("<|assistant_end|>")]
    backend = make_backend(tok, script)
    sink = run(backend, greedy(Message("user", "2+3?")))
    assert sink.text == "<|python_start|>2+3<|python_end|><|output_start|>5<|output_end|>Done"
    final = sink.events[-1]
    assert isinstance(final, Finish) and final.reason == "stop"
    n_reply = 1 + len(tok.encode("2+3")) + 1 + 3 + len(tok.encode("Done"))
    assert final.usage.completion_tokens == n_reply
    fed = [chunk[0] for chunk in backend.model.fed[1:]]  # every emitted token is fed back
    assert fed[fed.index(s("<|python_end|>")) + 1 :][:3] == [
        s("<|output_start|>"),
        *tok.encode("5"),
        s("<|output_end|>"),
    ]


def test_a_refused_expression_forces_nothing(tok):
    state = CalculatorState(tok)
    for token in [tok.special_id("<|python_start|>"), *tok.encode("2**8"), tok.special_id("<|python_end|>")]:
        state.observe(token)
    assert state.next_forced() is None


def test_bos_ends_the_reply_too(tok):
    sink = run(
        make_backend(tok, [*tok.encode("Hi"), tok.special_id("<|bos|>")]), greedy(Message("user", "x"))
    )
    assert sink.text == "Hi" and sink.events[-1].reason == "stop"


def test_the_budget_ends_with_length(tok):
    sink = run(
        make_backend(tok, tok.encode("The capital of France")), greedy(Message("user", "x"), max_tokens=3)
    )
    final = sink.events[-1]
    assert final.reason == "length" and final.usage.completion_tokens == 3
    assert sink.text == tok.decode(tok.encode("The capital of France")[:3]).decode()


def test_a_stop_string_ends_the_reply(tok):
    script = [*tok.encode("Paris. Then more"), tok.special_id("<|assistant_end|>")]
    sink = run(make_backend(tok, script), greedy(Message("user", "x"), stop=(". T",)))
    final = sink.events[-1]
    assert sink.text == "Paris" and final.reason == "stop" and final.stop_sequence == ". T"


def test_cancelled_requests_push_nothing_more(tok):
    backend = make_backend(tok, tok.encode("The quick brown fox jumps over the lazy dog"))
    request = greedy(Message("user", "x"))
    sink = RecordingSink(cancel_after=2)
    generated = backend.generate(request, backend.validate(request), sink)
    assert sum(isinstance(e, TextDelta) for e in sink.events) == 2
    assert not any(isinstance(e, Finish) for e in sink.events)
    assert generated == 2


def test_a_long_prompt_is_prefilled_in_chunks(tok):
    request = greedy(Message("user", "The quick brown fox jumps over the lazy dog. " * 60))
    n_chunks = -(-len(make_backend(tok, n_ctx=2048).tokenize(request)) // 256)
    # the scripted model pops an entry per forward: the last chunk's answers the prompt
    backend = make_backend(tok, [0] * (n_chunks - 1) + [tok.special_id("<|assistant_end|>")], n_ctx=2048)
    prompt = backend.validate(request)
    assert len(prompt.tokens) > 512
    sink = run(backend, request)
    assert sink.events[-1].reason == "stop" and sink.events[-1].usage.completion_tokens == 0
    sizes = [len(chunk) for chunk in backend.model.fed]
    assert sizes[:-1] == [256] * (len(sizes) - 1) and sum(sizes) == len(prompt.tokens)
    assert sink.events[-1].usage.prompt_tokens == len(prompt.tokens)


def test_ignore_eos_runs_through_the_terminal_token(tok):
    script = [*tok.encode("Hi"), tok.special_id("<|assistant_end|>"), *tok.encode("yo")]
    request = greedy(Message("user", "x"), max_tokens=len(script), ignore_eos=True)
    sink = run(make_backend(tok, script), request)
    assert sink.text == "Hi<|assistant_end|>yo" and sink.events[-1].reason == "length"
