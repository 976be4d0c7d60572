"""``manage.py lmserve MODEL [flags]``: a flag the model's family cannot honour is refused at
start-up by name (before the database is touched or anything is served), never accepted and
silently unused; the flags a family honours pass. Synthetic files of each family: only their
headers are read."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from inference.management.options import refuse_unserved_flags
from tests.fixtures.synthetic_diffusion_gemma import diffusion_gemma_path
from tests.fixtures.synthetic_gguf import synthetic_path
from tests.fixtures.synthetic_inkling import inkling_path

NUMPY_LAYERS = "its forward runs the numpy layers one conversation after another"


def model_file(name: str, synthetic_dir):
    if name == "inkling":
        return inkling_path("inkling", synthetic_dir)
    if name == "diffusion-gemma":
        return diffusion_gemma_path(synthetic_dir)
    return synthetic_path(name, synthetic_dir)


@pytest.mark.parametrize(
    "family, flags, refused",
    [
        # Each of these was accepted and did nothing of what it says.
        ("inkling", ["--spec"], "--spec is not supported for the inkling family: its short-convolution"),
        ("diffusion-gemma", ["--spec"], "--spec is not supported for the diffusion-gemma family"),
        ("diffusion-gemma", ["--kv-cache-dir", "kv"], "--kv-cache-dir is not supported for the diffusion"),
        ("diffusion-gemma", ["--batch", "2"], "--batch 2 is not supported for the diffusion-gemma family"),
        # Accepted and served by looping over the conversations, while /health said batch: true.
        ("gemma4", ["--batch", "4"], f"--batch 4 is not supported for the gemma4 family: {NUMPY_LAYERS}"),
        ("qwen3moe", ["--batch", "2"], f"--batch 2 is not supported for the qwen3moe family: {NUMPY_LAYERS}"),
        ("inkling", ["--batch", "2"], f"--batch 2 is not supported for the inkling family: {NUMPY_LAYERS}"),
        # Served one request after another.
        ("qwen35", ["--batch", "2"], "--batch 2 is not supported for the qwen35 family: its backend serves"),
        # Once a load failure after the weights were read; now a refusal before anything loads.
        ("qwen35", ["--spec"], "--spec is not supported for the qwen35 family: its recurrent state"),
        ("inkling", ["--cartridge", "c.safetensors"], "--cartridge is not supported for the inkling family"),
    ],
)
def test_a_flag_the_family_cannot_honour_is_refused_by_name(synthetic_dir, family, flags, refused):
    path = model_file(family, synthetic_dir)
    with pytest.raises(CommandError, match=f"^{refused}"):
        call_command("lmserve", str(path), *flags)


def test_every_refused_flag_is_named_at_once(synthetic_dir):
    path = model_file("diffusion-gemma", synthetic_dir)
    with pytest.raises(CommandError) as caught:
        call_command("lmserve", str(path), "--spec", "--batch", "3", "--kv-cache-dir", "kv")
    message = str(caught.value)
    assert [part.split(" is not supported")[0] for part in message.split("; ")] == [
        "--spec",
        "--batch 3",
        "--kv-cache-dir",
    ]


@pytest.mark.parametrize(
    "family, options",
    [
        ("llama", dict(spec=True, batch=4, kv_cache_dir="kv", cartridge="c.safetensors")),
        ("gemma4", dict(spec=True, batch=1, kv_cache_dir="kv")),  # speculation runs on the numpy path
        ("inkling", dict(spec=False, batch=1)),
    ],
)
def test_flags_the_family_honours_pass(synthetic_dir, family, options):
    assert refuse_unserved_flags(model_file(family, synthetic_dir), options) is None
