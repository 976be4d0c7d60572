"""nanochat's engine: the forward against an independent plain-loop numpy reference (written
from gpt.py's definition, reading the raw tensors, sharing no code with the model), the cache
path (prefill, then one token at a time) against the whole-sequence forward, the attention
window, and the checkpoint reader (geometry from shapes, BF16, refusals)."""

from __future__ import annotations

import dataclasses
import json
import math
import struct

import numpy as np
import pytest

from inference.engine.models.nanochat import NanochatModel
from inference.engine.nanochat_checkpoint import NanochatCheckpointError, load_checkpoint
from tests.fixtures.synthetic_nanochat import random_tensors, write_nanochat_checkpoint

EPS = float(np.finfo(np.float32).eps)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return load_checkpoint(write_nanochat_checkpoint(tmp_path_factory.mktemp("nano") / "ck"))


@pytest.fixture(scope="module")
def tensors(checkpoint):
    """The raw float64 parameters the checkpoint was written from."""
    return {k: v.astype(np.float64) for k, v in random_tensors(checkpoint.tokenizer.n_vocab).items()}


def norm(v):
    return [x / math.sqrt(sum(y * y for y in v) / len(v) + EPS) for x in v]


def sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def matvec(w, v):
    return [float(np.dot(row, v)) for row in w]


def rotate(v, pos, hd):
    """gpt.py apply_rotary_emb for one head vector: y1 = x1 cos + x2 sin, y2 = x2 cos - x1 sin."""
    half, out = hd // 2, list(v)
    for j in range(half):
        angle = pos / (100000.0 ** (2 * j / hd))
        c, s = math.cos(angle), math.sin(angle)
        out[j], out[j + half] = v[j] * c + v[j + half] * s, v[j + half] * c - v[j] * s
    return out


def reference_logits(t, ids, vocab, n_head=2, n_kv=1, hd=64, window=513):
    """The whole-sequence forward in plain loops, float64."""
    n_layer = len(t["resid_lambdas"])
    emb = [norm(t["transformer.wte.weight"][i]) for i in ids]
    x0 = []
    for p, e in enumerate(emb):
        if p == 0:
            x0.append(list(e))
            continue
        gate = t["smear_lambda"][0] * sig(float(np.dot(t["smear_gate.weight"][0], e[:24])))
        x0.append([a + gate * b for a, b in zip(e, emb[p - 1], strict=True)])
    x, backout = [list(r) for r in x0], None
    for i in range(n_layer):
        pre = f"transformer.h.{i}."
        x = [
            [t["resid_lambdas"][i] * a + t["x0_lambdas"][i] * b for a, b in zip(r, r0, strict=True)]
            for r, r0 in zip(x, x0, strict=True)
        ]
        ks, vs, qs = [], [], []
        for p, row in enumerate(x):
            h = norm(row)
            q, k, v = (matvec(t[pre + f"attn.c_{n}.weight"], h) for n in "qkv")
            if pre + "attn.ve_gate.weight" in t:
                ve = t[f"value_embeds.{i}.weight"][ids[p]]
                for kv in range(n_kv):
                    g = 3.0 * sig(float(np.dot(t[pre + "attn.ve_gate.weight"][kv], h[:12])))
                    for d in range(hd):
                        v[kv * hd + d] += g * ve[kv * hd + d]
            qs.append(
                [[1.2 * a for a in norm(rotate(q[hh * hd : (hh + 1) * hd], p, hd))] for hh in range(n_head)]
            )
            ks.append(
                [[1.2 * a for a in norm(rotate(k[kv * hd : (kv + 1) * hd], p, hd))] for kv in range(n_kv)]
            )
            vs.append([v[kv * hd : (kv + 1) * hd] for kv in range(n_kv)])
        for p in range(len(x)):
            y = []
            for hh in range(n_head):
                kv = hh * n_kv // n_head
                keys = [j for j in range(p + 1) if p - j < window]
                scores = [float(np.dot(qs[p][hh], ks[j][kv])) / math.sqrt(hd) for j in keys]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                y += [
                    sum(w * vs[j][kv][d] for w, j in zip(weights, keys, strict=True)) / total
                    for d in range(hd)
                ]
            x[p] = [a + b for a, b in zip(x[p], matvec(t[pre + "attn.c_proj.weight"], y), strict=True)]
            hidden = [max(a, 0.0) ** 2 for a in matvec(t[pre + "mlp.c_fc.weight"], norm(x[p]))]
            x[p] = [a + b for a, b in zip(x[p], matvec(t[pre + "mlp.c_proj.weight"], hidden), strict=True)]
        if i == n_layer // 2:
            backout = [list(r) for r in x]
    out = []
    for row, b in zip(x, backout, strict=True):
        final = norm([a - t["backout_lambda"][0] * c for a, c in zip(row, b, strict=True)])
        logits = matvec(t["lm_head.weight"][:vocab], final)
        out.append([15.0 * math.tanh(v / 15.0) for v in logits])
    return np.array(out)


def prompt_ids(checkpoint, text="What is the capital of France? 42"):
    tok = checkpoint.tokenizer
    return [tok.special_id("<|bos|>"), *tok.encode(text)]


def test_geometry_is_read_from_the_shapes(checkpoint):
    cfg = checkpoint.model.config
    assert (cfg.n_layer, cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.n_embd) == (3, 2, 1, 64, 128)
    assert cfg.vocab_size == 325 and checkpoint.model.weights.wte.shape[0] == 384
    assert [cfg.has_value_embedding(i) for i in range(3)] == [True, False, True]


def test_prefill_matches_the_plain_loop_reference(checkpoint, tensors):
    ids = prompt_ids(checkpoint)
    model = checkpoint.model
    ours = model.forward(model.new_cache(len(ids)), ids)
    ref = reference_logits(tensors, ids, model.config.vocab_size)
    assert ours.shape == ref.shape == (len(ids), 325)
    np.testing.assert_allclose(ours, ref, atol=2e-5, rtol=0)
    assert np.array_equal(ours.argmax(-1), ref.argmax(-1))


def test_decoding_token_by_token_matches_the_whole_sequence(checkpoint):
    """The cache path (prefill in chunks, then one token at a time: each chunk's first token
    smears with the cached previous embedding) gives the logits of the whole-sequence forward."""
    ids = prompt_ids(checkpoint, "Hello there! How are you doing today? I'm fine, thanks.")
    model = checkpoint.model
    whole = model.forward(model.new_cache(len(ids)), ids)
    cache = model.new_cache(len(ids))
    rows = [model.forward(cache, ids[:3]), model.forward(cache, ids[3:8])]
    rows += [model.forward(cache, [token]) for token in ids[8:]]
    np.testing.assert_allclose(np.concatenate(rows), whole, atol=1e-5, rtol=0)
    assert cache.length == len(ids)


def test_the_attention_window_drops_keys_beyond_sequence_len(checkpoint, tensors):
    """A query sees itself and the sequence_len keys before it (gpt.py's finite 'L' window):
    with sequence_len 4 and a 12-token prompt the far past is out of sight, as the reference
    says, and the logits differ from full attention."""
    small = dataclasses.replace(checkpoint.model.config, sequence_len=4)
    model = NanochatModel(small, checkpoint.model.weights)
    ids = prompt_ids(checkpoint, "The quick brown fox jumps over the dog")[:12]
    ours = model.forward(model.new_cache(len(ids)), ids)
    np.testing.assert_allclose(ours, reference_logits(tensors, ids, 325, window=5), atol=2e-5, rtol=0)
    full = checkpoint.model.forward(checkpoint.model.new_cache(len(ids)), ids)
    assert np.abs(ours[-1] - full[-1]).max() > 1e-3
    np.testing.assert_allclose(ours[:5], full[:5], atol=1e-5)  # within the window: the same


def test_a_full_cache_is_refused(checkpoint):
    from inference.engine.models.nanochat import ContextFull

    with pytest.raises(ContextFull):
        checkpoint.model.forward(checkpoint.model.new_cache(2), [1, 2, 3])


def _write_safetensors(path, tensors, dtype):
    """A safetensors file by hand: F32 as is, BF16 as the high halves of the float32 bits."""
    header, blobs, offset = {}, [], 0
    for name, value in tensors.items():
        raw = value.astype(np.float32)
        data = (raw.view(np.uint32) >> 16).astype(np.uint16).tobytes() if dtype == "BF16" else raw.tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(value.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def test_bf16_checkpoints_load_as_their_float32_values(checkpoint, tmp_path):
    source = random_tensors(checkpoint.tokenizer.n_vocab)
    _write_safetensors(tmp_path / "model.safetensors", source, "BF16")
    (tmp_path / "tokenizer.bin").write_bytes((checkpoint.directory / "tokenizer.bin").read_bytes())
    loaded = load_checkpoint(tmp_path)
    truncated = (source["lm_head.weight"].view(np.uint32) & 0xFFFF0000).view(np.float32)
    assert np.array_equal(loaded.model.weights.lm_head, truncated)
    ids = prompt_ids(checkpoint)
    logits = loaded.model.forward(loaded.model.new_cache(len(ids)), ids)
    reference = checkpoint.model.forward(checkpoint.model.new_cache(len(ids)), ids)
    assert np.abs(logits - reference).max() < 0.1  # bf16 rounding only


def test_broken_checkpoints_are_refused_by_name(checkpoint, tmp_path):
    with pytest.raises(NanochatCheckpointError, match="no tokenizer.bin"):
        (tmp_path / "model.safetensors").write_bytes(b"")
        load_checkpoint(tmp_path)
    source = random_tensors(checkpoint.tokenizer.n_vocab)
    del source["lm_head.weight"]
    _write_safetensors(tmp_path / "model.safetensors", source, "F32")
    (tmp_path / "tokenizer.bin").write_bytes((checkpoint.directory / "tokenizer.bin").read_bytes())
    with pytest.raises(NanochatCheckpointError, match="no tensor lm_head.weight"):
        load_checkpoint(tmp_path)
    source = random_tensors(checkpoint.tokenizer.n_vocab)
    source["transformer.h.1.mlp.c_fc.weight"] = source["transformer.h.1.mlp.c_fc.weight"][:-1]
    _write_safetensors(tmp_path / "model.safetensors", source, "F32")
    with pytest.raises(
        NanochatCheckpointError, match=r"transformer.h.1.mlp.c_fc.weight has shape \(511, 128\)"
    ):
        load_checkpoint(tmp_path)
