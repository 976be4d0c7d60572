"""The family descriptors: each family's facts in one place, read by the engine."""

from __future__ import annotations

import dataclasses

from inference.engine.chat_template import FALLBACKS
from inference.engine.engine import Engine
from inference.engine.families import FAMILIES, LLAMA_CPP_SAMPLING, QWEN3_SAMPLING, StateKind, family_of
from inference.engine.gguf_file import GGUFFile
from inference.engine.sampler import SamplingParams
from inference.engine.tokenizer import load_tokenizer
from tests.fixtures.generation import generate_ids
from tests.fixtures.model_files import default_model_path


def test_every_family_names_a_known_template_fallback():
    assert {family.template_fallback for family in FAMILIES.values()} <= set(FALLBACKS)
    assert FAMILIES["gemma3"].template_fallback == "gemma"
    assert FAMILIES["llama"].template_fallback == "chatml"


def test_qwen3_families_think_and_call_tools_llama_does_neither():
    for name in ("qwen3", "qwen3moe"):
        assert FAMILIES[name].think is not None and FAMILIES[name].tools is not None
        assert FAMILIES[name].sampling == QWEN3_SAMPLING
    assert FAMILIES["qwen2"].tools is not None and FAMILIES["qwen2"].think is None
    assert FAMILIES["llama"].think is None and FAMILIES["llama"].tools is None
    assert FAMILIES["llama"].sampling == LLAMA_CPP_SAMPLING
    # Recurrent state (qwen35, inkling's short convs) only rolls forward and diffusion commits
    # whole canvases: no request of theirs may start from another's rows.
    stateful = {"qwen35", "qwen35moe", "inkling", "diffusion-gemma"}
    assert {name for name, family in FAMILIES.items() if not family.kv_reuse} == stateful
    assert not FAMILIES["inkling"].spec


def test_family_stop_tokens_join_the_vocabulary_end_ids():
    path = default_model_path()
    f = GGUFFile(path)
    family = family_of(f)
    tokenizer = load_tokenizer(f.metadata)
    plain = Engine(path, f, family.model(f), tokenizer, family)
    assert plain.stop_ids == tokenizer.eog_ids
    extra = dataclasses.replace(family, stop_tokens=("<|im_start|>", "no such token text"))
    engine = Engine(path, f, family.model(f), tokenizer, extra)
    start = tokenizer.token_id("<|im_start|>")
    assert start is not None and start not in tokenizer.eog_ids
    assert engine.stop_ids == tokenizer.eog_ids | {start}


def test_family_stop_token_ends_a_generation():
    engine = Engine.load(default_model_path())
    prompt = engine.encode_chat([{"role": "user", "content": "Say hello."}])
    cache = engine.new_cache(256)
    free = generate_ids(engine, cache, prompt, SamplingParams(), 6, ignore_eos=True)
    first_text = engine.tokenizer.token_text(free[1])
    family = dataclasses.replace(engine.family, stop_tokens=(first_text,))
    stopping = Engine(engine.path, engine.file, engine.model, engine.tokenizer, family)
    cut = generate_ids(stopping, stopping.new_cache(256), prompt, SamplingParams(), 6)
    assert cut == free[: free.index(free[1])]


def test_serving_facts_follow_from_the_state_kind():
    # (state, kv_reuse, spec, batch, backend, grammar) per family: one fact each, the rest derived.
    kv = (StateKind.KV, True, True, True, "conversation", True)
    numpy_kv = (StateKind.KV, True, True, False, "conversation", True)  # no fused forward: no shared pass
    recurrent = (StateKind.RECURRENT, False, False, False, "recurrent", True)
    expected = {
        "llama": kv,
        "qwen2": kv,
        "qwen3": kv,
        "gemma3": kv,
        "qwen3moe": numpy_kv,
        "gemma4": numpy_kv,
        "qwen35": recurrent,
        "qwen35moe": recurrent,
        "inkling": (StateKind.ROLLING, False, False, False, "conversation", True),
        "diffusion-gemma": (StateKind.DIFFUSION, False, False, False, "diffusion", False),
    }
    facts = {
        name: (f.state, f.kv_reuse, f.spec, f.batch, f.backend, f.grammar) for name, f in FAMILIES.items()
    }
    assert facts == expected
    # batch is the layer code's: a family whose model class builds no fused forward never batches.
    assert {name for name, f in FAMILIES.items() if f.model.may_fuse()} == {
        "llama",
        "qwen2",
        "qwen3",
        "gemma3",
    }
    assert FAMILIES["gemma4"].template_fallback == "gemma4"
    assert FAMILIES["gemma4"].stop_tokens == ("<turn|>", "<eos>")
