"""Self-study: synthetic conversations about a corpus and the teacher's targets on them.

One conversation (the Cartridges paper's Algorithm 1 with one turn): sample a span of the
corpus (256-512 tokens) and a seed prompt type; bot A (the model, temperature 0.6) sees the
span and writes a message about it; bot B (the model, greedy) answers that message with the
span in its context. The teacher is the model with the span in context: its top-20 next-token
probabilities (to 0.99 cumulative mass) on B's answer are the distillation targets, taken from
the very rows that chose B's tokens. The student sees the same conversation without the span
(the cartridge stands in for it), so its tokens are what serving will see: the chat template's
rendering of the one user message.

Both bots' prompts open with the same system message (the excerpt), so the span is prefilled
once per conversation; the seed prompt and B's question are the user turns that follow it.
Conversations are synthesised in batches whose replies decode in lockstep (``replies.py``).

Seed prompts carry only the form of a question, never content: the span is the only content
selector, so bot B can answer from what it sees rather than from guesses.

Bot A's reply opens with a few words of a question or request chosen with its seed type
(``SEED_OPENERS``: "Who", "How many", "Can you summarize what the excerpt says about", ...) and
ends at its first "?" or line break. Small models asked to write a question about an excerpt
mostly copy a sentence of it instead (SmolLM2-135M and Qwen2.5-Coder-0.5B did so in most
conversations), and bot B then repeats that sentence: an answer the student can copy from its
own prompt teaches the cartridge nothing about the corpus. Opened as a question, A finishes a
question, and B answers it from the span.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from inference.engine.engine import Engine
from inference.engine.kv_cache import KVCache
from inference.engine.sampler import Sampler, SamplingParams
from inference.engine.training.distill import TeacherTargets

from .replies import Reply, decode_replies

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
    "mechanism": (
        "Ask why or how something described in the excerpt works or happens, so that the answer "
        "must explain it from the excerpt."
    ),
    "verbatim": (
        "Ask for the exact wording, number or name the excerpt gives for one specific thing, "
        "quoted precisely."
    ),
}
SEED_TYPES = tuple(SEED_PROMPTS)
# The first words of bot A's reply, per seed type: the form of a question, never content.
SEED_OPENERS = {
    "structuring": (
        "Can you list the key facts about",
        "Can you organise as a list what the excerpt says about",
    ),
    "summarization": (
        "Can you summarize what the excerpt says about",
        "In short, what does the excerpt say about",
    ),
    "question": ("What", "Who", "When", "Where", "Which", "How many", "How long", "What is the name of"),
    "use_case": ("I am planning to", "If I want to", "As a visitor, what should I know about"),
    "creative": ("Write a short poem about", "Write a short story about"),
    "mechanism": ("Why", "How does", "How do"),
    "verbatim": ("What exact", "What exactly does the excerpt say about", "What is the exact"),
}
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
    per_span: int = 4  # conversations about one span: its prefill is shared by all of them


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


EXCERPT_SYSTEM = "Here is an excerpt of a document:\n\n<excerpt>\n{span}\n</excerpt>"
ASK_SUFFIX = " Reply with your message only."


@dataclass(frozen=True)
class ConversationPlan:
    """What a conversation's seed decides before the model runs: the span, the seed prompt's
    type, the words bot A's reply opens with and bot A's sampling seed."""

    index: int
    span: tuple[int, int]
    seed_type: str
    opener: str
    sampler_seed: int


def sample_span(rng: np.random.Generator, n_tokens: int, config: SelfStudyConfig) -> tuple[int, int]:
    """A uniformly placed span of a uniformly drawn length (clipped to the corpus)."""
    length = min(int(rng.integers(config.span_min, config.span_max + 1)), n_tokens)
    start = int(rng.integers(0, n_tokens - length + 1))
    return start, start + length


def plan_conversation(seed: int, index: int, n_tokens: int, config: SelfStudyConfig) -> ConversationPlan:
    """Conversation ``index`` of the run seeded ``seed``: consecutive groups of ``per_span``
    conversations share a span (drawn from the group's seed), and each draws its own seed type
    and sampler seed. The plan depends on nothing else, so any worker makes the same one."""
    span = sample_span(np.random.default_rng([seed, index // config.per_span]), n_tokens, config)
    own = np.random.default_rng([seed, index, 1])
    seed_type = SEED_TYPES[int(own.integers(len(SEED_TYPES)))]
    sampler_seed = int(own.integers(2**31))
    openers = SEED_OPENERS[seed_type]
    return ConversationPlan(index, span, seed_type, openers[int(own.integers(len(openers)))], sampler_seed)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass
class _Pending:
    """A conversation between its two bots."""

    plan: ConversationPlan
    system: dict  # the excerpt message both bots' prompts open with
    prompt_a: list[int]
    base: KVCache | None = None  # the rows every prompt about this span shares
    ask: Reply | None = None


def excerpt_message(engine: Engine, corpus: Sequence[int], span: tuple[int, int]) -> dict:
    """The system message both bots' prompts open with: the span of ``corpus`` as text."""
    tok = engine.tokenizer
    text = tok.decode([t for t in corpus[span[0] : span[1]] if t != tok.bos_id])
    return {"role": "system", "content": EXCERPT_SYSTEM.format(span=text)}


def _pending(engine: Engine, corpus: Sequence[int], plan: ConversationPlan) -> _Pending:
    system = excerpt_message(engine, corpus, plan.span)
    ask = [system, {"role": "user", "content": SEED_PROMPTS[plan.seed_type] + ASK_SUFFIX}]
    return _Pending(plan, system, engine.encode_chat(ask, continuation=plan.opener))


@functools.lru_cache(maxsize=4)
def question_ends(tokenizer) -> frozenset[int]:
    """The tokens that end bot A's message once written: those holding a "?" or a line break."""
    return frozenset(
        t for t in range(tokenizer.vocab_size) if any(c in tokenizer.token_bytes(t) for c in b"?\n")
    )


def _open_asks(engine: Engine, group: list[_Pending], config: SelfStudyConfig) -> None:
    """Prefill the rows a span's prompts share once, then each of bot A's prompts behind a
    copy of them."""
    first = group[0].prompt_a
    shared = min([len(first) - 1] + [_common_prefix(first, p.prompt_a) for p in group[1:]])
    base = engine.new_cache(shared + 1)
    if shared:
        engine.prefill(base, first[:shared])
    ends = question_ends(engine.tokenizer)
    for p in group:
        cache = engine.new_cache(len(p.prompt_a) + config.max_question)
        cache.copy_rows_from(base, shared)
        logits = engine.prefill(cache, p.prompt_a[shared:])
        params = SamplingParams(temperature=config.temperature_a, seed=p.plan.sampler_seed)
        p.base = base
        p.ask = Reply(cache, logits, Sampler(params), list(p.prompt_a), config.max_question, end_ids=ends)


def _question(engine: Engine, p: _Pending) -> str:
    """Bot A's message: its opener and what it wrote after it."""
    written = engine.tokenizer.decode(p.ask.tokens)
    return (p.plan.opener + written).strip() or GENERIC_QUESTION


def _open_answer(engine: Engine, p: _Pending, question: str, config: SelfStudyConfig) -> Reply:
    """Bot B's reply to ``question``, its prompt prefilled behind the span's shared rows."""
    prompt_b = engine.encode_chat([p.system, {"role": "user", "content": question}])
    shared = min(p.base.common_prefix(prompt_b), len(prompt_b) - 1)
    cache = engine.new_cache(len(prompt_b) + config.max_answer + 1)
    cache.copy_rows_from(p.base, shared)
    logits = engine.prefill(cache, prompt_b[shared:])
    greedy = Sampler(SamplingParams())
    return Reply(
        cache, logits, greedy, list(prompt_b), config.max_answer, top_k=config.top_k, top_mass=config.top_mass
    )


def synthesize_batch(
    engine: Engine,
    corpus: Sequence[int],
    plans: Sequence[ConversationPlan],
    config: SelfStudyConfig | None = None,
) -> list[Conversation]:
    """The planned conversations, decoded together: bot A's messages in one lockstep batch,
    then bot B's answers in another. Both bots' prompts open with the same excerpt message, so
    the conversations about one span prefill it once. A conversation depends only on its plan,
    never on the others in the batch."""
    config = config or SelfStudyConfig()
    pending = [_pending(engine, corpus, plan) for plan in plans]
    groups: dict[tuple[int, int], list[_Pending]] = {}
    for p in pending:
        groups.setdefault(p.plan.span, []).append(p)
    for group in groups.values():
        _open_asks(engine, group, config)
    decode_replies(engine, [p.ask for p in pending])
    questions = [_question(engine, p) for p in pending]
    answers = []
    for p, question in zip(pending, questions, strict=True):
        p.ask = None  # A's cache is no longer needed
        answers.append(_open_answer(engine, p, question, config))
    decode_replies(engine, answers)
    conversations = []
    for p, question, answer in zip(pending, questions, answers, strict=True):
        prompt = tuple(engine.encode_chat([{"role": "user", "content": question}]))
        plan = p.plan
        conversations.append(
            Conversation(plan.seed_type, plan.span, question, prompt, tuple(answer.tokens), answer.targets)
        )
    return conversations


def synthesize_many(
    engine: Engine,
    corpus: Sequence[int],
    seed: int,
    count: int,
    config: SelfStudyConfig | None = None,
    first: int = 0,
) -> list[Conversation]:
    """Conversations ``first .. first + count`` of the run seeded ``seed``, in one batch."""
    config = config or SelfStudyConfig()
    plans = [plan_conversation(seed, i, len(corpus), config) for i in range(first, first + count)]
    return synthesize_batch(engine, corpus, plans, config)
