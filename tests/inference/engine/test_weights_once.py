"""What a loaded model keeps resident: 4-bit codes once (as the fused step's nibbles), none of
the file's pages, and KV caches that take memory as their rows are written (heap.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from inference.engine.engine import Engine
from inference.engine.heap import lazy_zeros
from inference.engine.quants import load_matrix
from inference.engine.quants.layout import dequantize_reference
from inference.engine.quants.matrix import GroupedMatrix
from inference.engine.quants.nibbles import NibbleLayout
from tests.fixtures.synthetic_gguf import synthetic_path

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[3]


def _mappings() -> list[tuple[int, int, str, int]]:
    """(start, stop, path, resident bytes) of every mapping of this process."""
    out, current = [], None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if not parts[0].endswith(":"):
                start, stop = (int(x, 16) for x in parts[0].split("-"))
                current = [start, stop, parts[5] if len(parts) > 5 else ""]
            elif parts[0] == "Rss:":
                out.append((*current, int(parts[1]) * 1024))
    return out


def _resident_anon() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))


def test_four_bit_matrices_keep_only_the_arena_nibbles(synthetic_dir):
    path = synthetic_path("llama", synthetic_dir)
    engine = Engine.load(path)
    arena = engine.model.fused.model[0][0]
    held = [
        (i, name, m)
        for i, layer in enumerate(engine.model.layers)
        for name, m in layer.items()
        if isinstance(m, GroupedMatrix) and isinstance(m.layout, NibbleLayout)
    ]
    assert held, "the synthetic llama has Q4_0, Q4_1 and Q4_K matrices"
    for i, name, m in held:
        assert np.shares_memory(m.layout.packed, arena), (i, name)
        if name in ("attn_qkv", "ffn_gate_up"):
            continue  # stacked at load: their parts are checked through the fused forward's tests
        t = engine.file.tensor(f"blk.{i}.{name}.weight")
        fresh = load_matrix(t.type, t.data, t.shape, t.name).layout
        np.testing.assert_array_equal(m.layout.q, fresh.q)
        np.testing.assert_array_equal(m.layout.scales, fresh.scales)
        rows = np.array([0, m.rows - 1, 1])
        np.testing.assert_array_equal(m.take_rows(rows), dequantize_reference(fresh, rows))


def test_a_loaded_model_keeps_none_of_the_file_mapped(synthetic_dir):
    path = os.path.realpath(synthetic_path("qwen2", synthetic_dir))
    engine = Engine.load(path)
    resident = sum(rss for _, _, name, rss in _mappings() if name == path)
    assert resident <= 64 * 1024, f"{resident} bytes of {os.path.getsize(path)} still mapped"
    cache = engine.new_cache(64)
    assert np.isfinite(engine.prefill(cache, [1, 2, 3])).all()


def test_lazy_zeros_take_pages_as_they_are_written():
    runs = lazy_zeros((64, MIB // 2), np.float16)  # 64 runs of 1 MiB, like a cache's (layer, head)
    assert runs.dtype == np.float16 and runs.shape == (64, MIB // 2) and runs.flags.writeable
    before = _resident_anon()
    runs[:, 0] = 1.0  # the first row of every run
    grown = _resident_anon() - before
    assert grown < 8 * MIB, f"{grown / MIB:.1f} MiB for 64 touched pages (huge pages would take 128)"
    assert runs[:, 1:].max() == 0 and runs[:, 0].min() == 1


def _mapping_of(array: np.ndarray) -> tuple[int, int, str]:
    address = array.__array_interface__["data"][0]
    return next((start, stop, name) for start, stop, name, _ in _mappings() if start <= address < stop)


LARGE_BLOCK_SCRIPT = """
import numpy as np
from inference.engine.heap import loading_heap
from tests.inference.engine.test_weights_once import MIB, _mapping_of
np.ones(30 * MIB, np.uint8)  # freed at once: glibc serves blocks below 30 MB from the heap now
with loading_heap():
    layout = np.ones(24 * MIB, np.uint8)
    start, stop, name = _mapping_of(layout)
print(name or "anonymous", stop - start)
"""


def test_large_blocks_of_a_load_are_mapped_on_their_own():
    """During a load a layout's block gets a mapping of its own, returned whole when freed;
    from the heap (glibc's choice once a 30 MB block was freed) its pages would stay. In a
    process of its own: a heap that earlier tests left with a large free chunk serves the
    block from that chunk whatever the mmap threshold says."""
    done = subprocess.run(
        [sys.executable, "-c", LARGE_BLOCK_SCRIPT], cwd=ROOT, capture_output=True, text=True, check=True
    )
    name, size = done.stdout.split()
    assert name != "[heap]" and int(size) <= 24 * MIB + 8192, (name, size)
