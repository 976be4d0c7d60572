"""Self-study: synthetic conversations about a corpus and the teacher's targets on them.

One conversation (the Cartridges paper's Algorithm 1 with one turn): sample a span of the
corpus (256-512 tokens) and a seed prompt type; bot A (the model, temperature 0.6) sees the
span and writes a message about it; bot B (the model, greedy) answers that message with the
span in its context. The teacher is the model with the span in context: its top-20 next-token
probabilities (to 0.99 cumulative mass) on B's answer are the distillation targets. The
student sees the same conversation without the span (the cartridge stands in for it), so its
tokens are what serving will see: the chat template's rendering of the one user message.

Seed prompts carry only the form of a question, never content: the span is the only content
selector, so bot B can answer from what it sees rather than from guesses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from inference.engine.engine import Engine
from inference.engine.sampler import SamplingParams
from inference.engine.training.distill import TeacherTargets, teacher_targets

SEED_PROMPTS = {
    "structuring": (
        "Pick one part of the excerpt and ask for it to be organised as a short structured list "
        "(for example JSON or bullet points) naming its key facts, names, numbers and dates."
    ),
    "summarization": "Ask for a short summary of one specific part of the excerpt.",
    "question": (
        "Ask one specific question whose answer is a fact stated in the excerpt (a name, a number, "
        "a date, a step, a rule). Do not answer it."
    ),
    "use_case": (
        "Think of a practical situation where someone would need the information in the excerpt, "
        "and ask the question that person would ask."
    ),
    "creative": (
        "Ask for something creative (a short poem, a slogan, a story) grounded in the excerpt's facts."
    ),
}
SEED_TYPES = tuple(SEED_PROMPTS)
GENERIC_QUESTION = "What does the document say?"


@dataclass(frozen=True)
class SelfStudyConfig:
    """The knobs of conversation synthesis (the paper's and the reference's defaults)."""

    span_min: int = 256
    span_max: int = 512
    max_question: int = 48
    max_answer: int = 128
    temperature_a: float = 0.6
    top_k: int = 20
    top_mass: float = 0.99


@dataclass(frozen=True)
class Conversation:
    """One self-study conversation as the student trains on it."""

    seed_type: str
    span: tuple[int, int]  # corpus token range [start, end) the teacher saw
    question: str
    prompt: tuple[int, ...]  # the student's prompt tokens (chat template, no span)
    answer: tuple[int, ...]  # bot B's answer tokens
    targets: TeacherTargets  # one row per supervised position

    @property
    def tokens(self) -> list[int]:
        """The student's input: prompt then answer."""
        return [*self.prompt, *self.answer]

    @property
    def head_rows(self) -> np.ndarray:
        """The rows whose logits are supervised: the prompt's last token (predicting the first
        answer token) through the answer's last (predicting what follows it)."""
        return np.arange(len(self.prompt) - 1, len(self.prompt) + len(self.answer))


def _excerpt_system(span_text: str, role: str) -> str:
    return f"You are {role}. Here is an excerpt of a document:\n\n<excerpt>\n{span_text}\n</excerpt>"


def _generate(engine: Engine, prompt: list[int], params: SamplingParams, max_tokens: int, n_ctx: int):
    cache = engine.new_cache(n_ctx)
    return cache, list(engine.generate(cache, prompt, params, max_tokens))


def sample_span(rng: np.random.Generator, n_tokens: int, config: SelfStudyConfig) -> tuple[int, int]:
    """A uniformly placed span of a uniformly drawn length (clipped to the corpus)."""
    length = min(int(rng.integers(config.span_min, config.span_max + 1)), n_tokens)
    start = int(rng.integers(0, n_tokens - length + 1))
    return start, start + length


def synthesize(
    engine: Engine,
    corpus: Sequence[int],
    rng: np.random.Generator,
    config: SelfStudyConfig | None = None,
) -> Conversation:
    """One conversation about a random span of ``corpus`` (token ids); the same ``rng`` state
    gives the same conversation."""
    config = config or SelfStudyConfig()
    start, end = sample_span(rng, len(corpus), config)
    seed_type = SEED_TYPES[int(rng.integers(len(SEED_TYPES)))]
    sampler_seed = int(rng.integers(2**31))
    text = engine.tokenizer.decode([t for t in corpus[start:end] if t != engine.tokenizer.bos_id])
    ask = [
        {"role": "system", "content": _excerpt_system(text, "a curious reader")},
        {"role": "user", "content": SEED_PROMPTS[seed_type] + " Reply with your message only."},
    ]
    prompt_a = engine.encode_chat(ask)
    params_a = SamplingParams(temperature=config.temperature_a, seed=sampler_seed)
    _, question_ids = _generate(
        engine, prompt_a, params_a, config.max_question, len(prompt_a) + config.max_question
    )
    question = engine.tokenizer.decode(question_ids).strip() or GENERIC_QUESTION
    teach = [
        {
            "role": "system",
            "content": _excerpt_system(text, "a helpful assistant answering from the excerpt"),
        },
        {"role": "user", "content": question},
    ]
    prompt_b = engine.encode_chat(teach)
    cache, answer = _generate(
        engine, prompt_b, SamplingParams(), config.max_answer, len(prompt_b) + config.max_answer + 1
    )
    logits = _teacher_logits(engine, cache, prompt_b, answer)
    targets = teacher_targets(logits, config.top_k, config.top_mass)
    student_prompt = engine.encode_chat([{"role": "user", "content": question}])
    return Conversation(seed_type, (start, end), question, tuple(student_prompt), tuple(answer), targets)


def _teacher_logits(engine: Engine, cache, prompt: list[int], answer: list[int]) -> np.ndarray:
    """The teacher's logits predicting each answer token and the token after the answer
    (len(answer) + 1, vocab), teacher-forced on the cache generation left behind (it holds the
    prompt's rows and the logits after it)."""
    cache.truncate(len(prompt))
    saved = cache.prefill_logits
    if saved is None or saved[0] != len(prompt):
        cache.truncate(0)
        first = engine.prefill(cache, prompt)
    else:
        first = saved[1]
    rows = [first[None]]
    if answer:
        rows.append(engine.model.forward(list(answer), cache, all_logits=True))
    return np.concatenate(rows).astype(np.float32)


def synthesize_many(
    engine: Engine, corpus: Sequence[int], seed: int, count: int, config: SelfStudyConfig | None = None
) -> list[Conversation]:
    """``count`` conversations from one seed (deterministic)."""
    rng = np.random.default_rng(seed)
    return [synthesize(engine, corpus, rng, config) for _ in range(count)]
