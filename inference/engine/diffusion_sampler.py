"""The entropy-bound sampler of block text diffusion (DiffusionGemma), over the canvas pass of
``models/diffusion_gemma.py``.

One canvas (``diffusion.canvas_length`` tokens after the committed rows) is denoised so:

1. start from uniformly random token ids (not mask tokens);
2. each step, at a temperature falling linearly from ``t_max`` towards ``t_min``, run the
   canvas pass and, per position, take the argmax, the entropy of softmax(z / t) and one
   multinomial draw from it;
3. accept positions in order of rising entropy while the entropy of those accepted before
   stays within ``entropy_bound`` (the mutual-information bound); an accepted position keeps
   its draw, every other one is renoised with a fresh random token;
4. stop after ``max_steps``, or earlier once the argmax canvas held still for
   ``stability_threshold`` steps with a mean entropy below ``confidence_threshold``. The
   canvas comes out as the last step's argmax.

Blocks: the prompt is encoded once; each denoised canvas is cut at its first end-of-generation
token (or where a degenerate repetition loop starts), the kept tokens are the block, and an
uncut canvas is committed whole through the encoder pass before the next block. Block ``b``
draws from a generator seeded with ``seed + b``: the same seed gives the same reply.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from .kv_cache import KVCache
from .models.diffusion_gemma import DiffusionGemmaModel, EntropyBound, SelfCondition

SC_P_MIN = 1e-6  # self-conditioning keeps the candidates of at least this probability...
SC_MAX_PER_ROW = 512  # ... the first this many of them in vocabulary order
ROWS_PER_CHUNK = 16  # canvas rows whose float64 softmax is held at once (memory bound)
LOOP_RUN = 6  # a token repeating at stride 1 or 2 this many times in a row is a runaway loop


@dataclass(frozen=True)
class StepDraw:
    """One sampler pass over a canvas's logits: per position the argmax, one draw and the
    entropy (nats) of softmax(z / t), and the sparse softmax for self-conditioning."""

    argmax: np.ndarray  # (n,) int64
    sampled: np.ndarray  # (n,) int64
    entropy: np.ndarray  # (n,) float64
    sc: SelfCondition | None


@dataclass(frozen=True)
class Block:
    """One committed block: the tokens kept from a denoised canvas, whether the reply ends
    with it (an end-of-generation token or a repetition loop cut it), and the steps it took."""

    tokens: list[int]
    finished: bool
    steps: int


def temperature(step: int, eb: EntropyBound) -> float:
    """The temperature of 0-based step ``step``: t_max at the first, falling linearly by
    (t_max - t_min) / max_steps per step (the reference's schedule)."""
    remaining = eb.max_steps - step
    return eb.t_min + (eb.t_max - eb.t_min) * remaining / eb.max_steps


def sampler_pass(logits: np.ndarray, temp: float, u: np.ndarray, collect_sc: bool) -> StepDraw:
    """Argmax, entropy, the draw (the first id whose cumulative mass reaches u * Z, in vocab
    order) and the self-conditioning candidates of every row of logits (n, vocab)."""
    n = logits.shape[0]
    argmax, sampled = np.empty(n, np.int64), np.empty(n, np.int64)
    entropy = np.empty(n, np.float64)
    ids, probs, counts = [], [], np.zeros(n, np.int64)
    for lo in range(0, n, ROWS_PER_CHUNK):
        z = logits[lo : lo + ROWS_PER_CHUNK].astype(np.float32) * np.float32(1.0 / temp)  # (r, vocab)
        argmax[lo : lo + len(z)] = z.argmax(axis=1)
        d = (z - z.max(axis=1, keepdims=True)).astype(np.float64)  # (r, vocab)
        e = np.exp(d)  # (r, vocab)
        total = e.sum(axis=1)  # (r,)
        entropy[lo : lo + len(z)] = np.log(total) - (e * d).sum(axis=1) / total
        cum = np.cumsum(e, axis=1)  # (r, vocab)
        hit = cum >= (u[lo : lo + len(z)] * total)[:, None]  # (r, vocab)
        sampled[lo : lo + len(z)] = np.where(hit.any(axis=1), hit.argmax(axis=1), logits.shape[1] - 1)
        if collect_sc:
            for r in range(len(z)):
                keep = np.flatnonzero(e[r] >= SC_P_MIN * total[r])[:SC_MAX_PER_ROW]  # (k,)
                mass = e[r, keep]
                ids.append(keep)
                probs.append((mass / mass.sum()).astype(np.float32))
                counts[lo + r] = len(keep)
    sc = None
    if collect_sc:
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # (n + 1,)
        sc = SelfCondition(np.concatenate(ids).astype(np.int64), np.concatenate(probs), offsets)
    return StepDraw(argmax, sampled, entropy, sc)


def entropy_bound_accept(entropy: np.ndarray, bound: float) -> np.ndarray:
    """Which positions keep their draw (n,) bool: in order of rising entropy (ties in position
    order), a position is accepted while the summed entropy of those before it is <= bound."""
    order = np.argsort(entropy, kind="stable")
    ranked = entropy[order].astype(np.float64)
    before = np.cumsum(ranked) - ranked  # (n,) entropy of the positions ahead in the order
    accepted = np.zeros(len(entropy), bool)
    accepted[order] = before <= bound
    return accepted


def repetition_onset(tokens: np.ndarray) -> int | None:
    """Where a degenerate loop starts (a token recurring at stride 1, else 2, LOOP_RUN times
    running), or None."""
    for stride in (1, 2):
        run = 0
        for j in range(len(tokens) - stride):
            run = run + 1 if tokens[j] == tokens[j + stride] else 0
            if run >= LOOP_RUN:
                return j + stride - run
    return None


def denoise(
    model: DiffusionGemmaModel,
    cache: KVCache,
    rng: np.random.Generator,
    eb: EntropyBound,
    cancelled: Callable[[], bool] = lambda: False,
) -> tuple[np.ndarray, int]:
    """Denoise one canvas after what ``cache`` holds; returns the canvas (C,) and the steps
    run (fewer when ``cancelled()`` turned true between steps: the canvas is then unfinished).
    The cache's committed rows are unchanged."""
    c, vocab = model.diffusion.canvas_length, model.config.vocab_size
    use_sc = model.self_cond is not None
    canvas = rng.integers(0, vocab, c)  # (C,)
    previous, held, sc, step = None, 0, None, 0
    for step in range(eb.max_steps):
        u, renoise = rng.random(c), rng.integers(0, vocab, c)  # (C,), (C,)
        draw = sampler_pass(model.canvas_forward(canvas, cache, sc), temperature(step, eb), u, use_sc)
        accepted = entropy_bound_accept(draw.entropy, eb.entropy_bound)
        canvas = np.where(accepted, draw.sampled, renoise)
        sc = draw.sc
        held = held + 1 if previous is not None and np.array_equal(previous, draw.argmax) else 0
        previous = draw.argmax
        if held >= eb.stability_threshold and draw.entropy.mean() < eb.confidence_threshold:
            break
        if cancelled():  # a step of a large model takes long: the client may leave meanwhile
            break
    return previous, step + 1


def generate_blocks(
    model: DiffusionGemmaModel,
    cache: KVCache,
    prompt: list[int],
    max_tokens: int,
    stop_ids: frozenset[int],
    seed: int,
    cancelled: Callable[[], bool] = lambda: False,
) -> Iterator[Block]:
    """Encode ``prompt`` into the empty ``cache`` and yield the reply's blocks, at most
    ``max_tokens`` tokens in all, until a block ends it or ``cancelled()`` turns true. The
    cache needs room for the prompt plus one canvas per block."""
    c, eb = model.diffusion.canvas_length, model.diffusion.sampler
    model.encode(prompt, cache)
    produced, index = 0, 0
    while produced < max_tokens and not cancelled():
        rng = np.random.default_rng((seed + index) % (1 << 64))
        canvas, steps = denoise(model, cache, rng, eb, cancelled)
        if cancelled():
            return
        index += 1
        cut = next((i for i, t in enumerate(canvas) if int(t) in stop_ids), None)
        if cut is None:
            cut = repetition_onset(canvas)
        keep = min(c if cut is None else cut, max_tokens - produced)
        produced += keep
        finished = cut is not None or produced >= max_tokens
        yield Block([int(t) for t in canvas[:keep]], cut is not None, steps)
        if finished:
            return
        model.encode([int(t) for t in canvas], cache)
