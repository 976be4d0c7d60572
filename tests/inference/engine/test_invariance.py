"""Path invariance: a row's logits are bitwise the same however it is computed.

One token per forward (decode), inside prefill chunks of any length, as one row of a lockstep
batch beside other conversations at other positions, or as a row of a verify run (and again
after truncating the cache back): every path must give ``np.array_equal`` logits. Checked on a
synthetic model of every family, which together hold every weight format (F32, F16, BF16,
Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K), with random tokens and random splits.
"""

from __future__ import annotations

import numpy as np
import pytest

from inference.engine.engine import BatchRow, Engine
from inference.engine.models.base import Run
from tests.fixtures.synthetic_gguf import SYNTHETIC_ARCHS, synthetic_path

N_TOKENS = 40  # (32 rows and more: tiles of blocks unpacked into scratch codes)
SEEDS = (0, 1)


def _decoded(engine: Engine, tokens: list[int]) -> np.ndarray:
    """The reference: one token per forward; the logits after each (n, vocab)."""
    cache = engine.new_cache(N_TOKENS + 8)
    return np.stack([engine.decode_one(cache, t) for t in tokens])


def _random_split(rng: np.random.Generator, n: int) -> list[int]:
    """Chunk lengths summing to n, from 1 to n."""
    cuts = sorted(rng.choice(np.arange(1, n), size=int(rng.integers(0, 5)), replace=False).tolist())
    bounds = [0, *cuts, n]
    return [b - a for a, b in zip(bounds, bounds[1:])]


@pytest.fixture(scope="module", params=SYNTHETIC_ARCHS)
def engine(request, synthetic_dir) -> Engine:
    return Engine.load(synthetic_path(request.param, synthetic_dir))


def _tokens(engine: Engine, rng: np.random.Generator) -> list[int]:
    return rng.integers(3, min(engine.config.vocab_size, 5000), N_TOKENS).tolist()


@pytest.mark.parametrize("seed", SEEDS)
def test_prefill_chunks_equal_one_token_decode(engine, seed):
    rng = np.random.default_rng(seed)
    tokens = _tokens(engine, rng)
    reference = _decoded(engine, tokens)
    cache, at, chunks = engine.new_cache(N_TOKENS + 8), 0, _random_split(rng, N_TOKENS)
    for n in chunks:
        got = engine.verify(cache, tokens[at : at + n])  # every row's logits of this chunk
        assert np.array_equal(got, reference[at : at + n]), f"chunks {chunks}: rows {at}..{at + n} differ"
        at += n
    whole = engine.verify(engine.new_cache(N_TOKENS + 8), tokens)  # every row in one forward
    assert np.array_equal(whole, reference), "all rows in one forward differ"
    # The facade's prefill (last logits only) agrees too.
    assert np.array_equal(engine.prefill(engine.new_cache(N_TOKENS), tokens), reference[-1])


@pytest.mark.parametrize("seed", SEEDS)
def test_lockstep_batch_rows_equal_their_own_decode(engine, seed):
    # Three conversations at different positions (different prefixes), decoded in lockstep.
    rng = np.random.default_rng(100 + seed)
    sequences = [_tokens(engine, rng) for _ in range(3)]
    references = [_decoded(engine, seq) for seq in sequences]
    caches = [engine.new_cache(N_TOKENS + 8) for _ in sequences]
    starts = [int(s) for s in rng.integers(1, N_TOKENS - 6, 3)]
    for cache, seq, start in zip(caches, sequences, starts):
        engine.prefill(cache, seq[:start])
    for step in range(6):
        rows = [BatchRow(cache, seq[start + step]) for cache, seq, start in zip(caches, sequences, starts)]
        logits = engine.decode_batch(rows)
        for i, (ref, start) in enumerate(zip(references, starts)):
            assert np.array_equal(logits[i], ref[start + step]), f"row {i} at position {start + step}"


@pytest.mark.parametrize("seed", SEEDS)
def test_verify_rows_and_truncation_equal_decode(engine, seed):
    rng = np.random.default_rng(200 + seed)
    tokens = _tokens(engine, rng)
    reference = _decoded(engine, tokens)
    cache = engine.new_cache(N_TOKENS + 8)
    start = int(rng.integers(1, N_TOKENS - 8))
    engine.prefill(cache, tokens[:start])
    draft = [int(t) for t in rng.integers(3, 5000, 5)]  # a wrong draft: rejected after its first row
    engine.verify(cache, draft)
    cache.truncate(start)
    got = engine.verify(cache, tokens[start : start + 5])
    assert np.array_equal(got, reference[start : start + 5])
    cache.truncate(start + 2)  # keep two, verify again from there
    assert np.array_equal(
        engine.verify(cache, tokens[start + 2 : start + 7]), reference[start + 2 : start + 7]
    )


def test_mixed_runs_in_one_forward_equal_separate_forwards(engine):
    # A prefill chunk, a verify run and a decode row of three caches in one forward.
    rng = np.random.default_rng(7)
    sequences = [_tokens(engine, rng) for _ in range(3)]
    references = [_decoded(engine, seq) for seq in sequences]
    caches = [engine.new_cache(N_TOKENS + 8) for _ in sequences]
    engine.prefill(caches[1], sequences[1][:5])
    engine.prefill(caches[2], sequences[2][:11])
    runs = [
        Run(caches[0], sequences[0][:7]),
        Run(caches[1], sequences[1][5:9], all_logits=True),
        Run(caches[2], sequences[2][11:12]),
    ]
    first, second, third = engine.forward(runs)
    assert np.array_equal(first, references[0][6])
    assert np.array_equal(second, references[1][5:9])
    assert np.array_equal(third, references[2][11])
    assert [c.n_tokens for c in caches] == [7, 9, 12]


def test_a_cache_may_take_one_run_per_forward(engine):
    cache = engine.new_cache(8)
    with pytest.raises(ValueError, match="its own cache"):
        engine.forward([Run(cache, [5]), Run(cache, [6])])
    with pytest.raises(ValueError, match="at least one token"):
        engine.forward([Run(cache, [])])
    assert cache.n_tokens == 0
