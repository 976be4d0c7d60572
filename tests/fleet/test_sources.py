"""CartridgeSource: the file read at construction, the model checked at start-up, one choice."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from fleet.cartridges.file import CartridgeFormatError, save_cartridge
from fleet.cartridges.init import initial_cartridge
from fleet.sources import CartridgeSource
from inference.engine.engine import Engine
from inference.engine.prefix import PrefixMismatchError
from inference.types import GenerationRequest, Message
from tests.fixtures.synthetic_gguf import synthetic_path


def test_a_cartridge_source_serves_its_file_and_refuses_another_model(synthetic_dir, tmp_path):
    llama = Engine.load(synthetic_path("llama", synthetic_dir))
    path = save_cartridge(tmp_path / "c.safetensors", initial_cartridge(llama, [5, 6, 7, 8]))
    source = CartridgeSource(path)
    source.check(llama)
    choice = source.choose(llama, GenerationRequest((Message("user", "hi"),)))
    assert choice.prefix.rows == 4 and choice.documents == () and choice.key.startswith("cartridge:")
    assert source.describe() == {"cartridge": {"path": str(path.resolve()), "rows": 4}}
    assert CartridgeSource(path).key == choice.key  # names the content: stable across restarts
    gemma = Engine.load(synthetic_path("gemma3", synthetic_dir))
    with pytest.raises(PrefixMismatchError, match=f"cartridge {path.resolve()}: KV geometry"):
        source.check(gemma)
    with pytest.raises(CartridgeFormatError, match="no such cartridge file"):
        CartridgeSource(tmp_path / "missing.safetensors")


def test_lmserve_refuses_a_cartridge_with_non_finite_rows_before_serving(synthetic_dir, tmp_path):
    """400 bytes of 0xFF in a cartridge's data (NaNs) used to start a server whose greedy
    replies were all empty; the file is refused by name instead."""
    llama = synthetic_path("llama", synthetic_dir)
    path = save_cartridge(
        tmp_path / "c.safetensors", initial_cartridge(Engine.load(llama), list(range(5, 25)))
    )
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")  # past the safetensors header
    data[start : start + 400] = b"\xff" * 400
    path.write_bytes(bytes(data))
    with pytest.raises(
        CommandError, match=f"^{path.resolve()}: 100 non-finite values \\(NaN or infinity\\) in layers"
    ):
        call_command("lmserve", str(llama), "--cartridge", str(path))
