"""Exactness: an untrained cartridge is the real prefill of its tokens.

A cartridge made from the model's own K/V of ``tokens[:p]`` (fleet.cartridges.init), installed
as a prefix with no token shadow, followed by a suffix gives logits bitwise equal to
prefilling ``tokens[:p] + suffix`` (every suffix row, and the decode steps after it), on every
synthetic family and on SmolLM2. Two parts cut from one capture (rows [0, a) and [a, p))
concatenated reproduce the whole: a fleet composition is a joined prefill.
"""

from __future__ import annotations

import numpy as np
import pytest

from fleet.cartridges.file import load_cartridge, save_cartridge
from fleet.cartridges.init import initial_cartridge
from inference.engine.engine import Engine
from inference.engine.prefix import KVPrefix
from tests.fixtures.model_files import default_model_path
from tests.fixtures.synthetic_gguf import SYNTHETIC_ARCHS, synthetic_path

N_TOKENS, P, DECODE = 24, 11, 4


def _tokens(engine: Engine, seed: int, n: int = N_TOKENS + DECODE) -> list[int]:
    rng = np.random.default_rng(seed)
    return rng.integers(3, min(engine.config.vocab_size, 5000), n).tolist()


def _reference(engine: Engine, tokens: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Every row's logits of the real prefill of tokens[:N_TOKENS], then decode steps."""
    cache = engine.new_cache(len(tokens) + 4)
    rows = engine.verify(cache, tokens[:N_TOKENS])  # (N_TOKENS, vocab)
    return rows, [engine.decode_one(cache, t) for t in tokens[N_TOKENS:]]


def _behind(engine: Engine, prefix: KVPrefix, tokens: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The same rows past the prefix, with the prefix installed instead of tokens[:P]."""
    cache = engine.new_cache(len(tokens) + 4)
    cache.install_prefix(prefix, "test")
    rows = engine.verify(cache, tokens[P:N_TOKENS])  # (N_TOKENS - P, vocab)
    assert cache.n_tokens == N_TOKENS - P and cache.n_positions == N_TOKENS
    return rows, [engine.decode_one(cache, t) for t in tokens[N_TOKENS:]]


def _assert_exact(engine: Engine, prefix: KVPrefix, tokens: list[int]) -> None:
    ref_rows, ref_steps = _reference(engine, tokens)
    rows, steps = _behind(engine, prefix, tokens)
    for i in range(rows.shape[0]):
        assert np.array_equal(rows[i], ref_rows[P + i]), f"suffix row {i} differs"
    for i, (got, want) in enumerate(zip(steps, ref_steps, strict=True)):
        assert np.array_equal(got, want), f"decode step {i} differs"


def _check_engine(engine: Engine, tmp_path, seed: int) -> None:
    tokens = _tokens(engine, seed)
    cartridge = initial_cartridge(engine, tokens[:P])
    _assert_exact(engine, cartridge.prefix(), tokens)
    # Through the file: f32 on disk holds the f16 rows exactly.
    loaded = load_cartridge(save_cartridge(tmp_path / "c.safetensors", cartridge))
    _assert_exact(engine, loaded.prefix(), tokens)
    # Two parts cut from one capture, concatenated: the joined prefill.
    a = 4
    whole = cartridge.prefix()
    parts = [KVPrefix(whole.k[:, :, :a], whole.v[:, :, :a]), KVPrefix(whole.k[:, :, a:], whole.v[:, :, a:])]
    _assert_exact(engine, KVPrefix.concat(parts), tokens)


@pytest.mark.parametrize("arch", SYNTHETIC_ARCHS)
def test_initial_cartridge_reproduces_the_prefill_on_every_family(arch, synthetic_dir, tmp_path):
    engine = Engine.load(synthetic_path(arch, synthetic_dir))
    _check_engine(engine, tmp_path, seed=1)


@pytest.mark.slow
def test_initial_cartridge_reproduces_the_prefill_on_smollm2(tmp_path):
    engine = Engine.load(default_model_path())
    _check_engine(engine, tmp_path, seed=2)


def test_a_different_prefix_changes_the_logits(synthetic_dir):
    # The check above could not fail if the prefix were ignored: show that it is not.
    engine = Engine.load(synthetic_path(SYNTHETIC_ARCHS[0], synthetic_dir))
    tokens = _tokens(engine, 3)
    other = initial_cartridge(engine, _tokens(engine, 4)[:P]).prefix()
    ref_rows, _ = _reference(engine, tokens)
    rows, _ = _behind(engine, other, tokens)
    assert not np.array_equal(rows[0], ref_rows[P])
