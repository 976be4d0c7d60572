"""Record llama.cpp's outputs on the real and synthetic models as test goldens.

A development tool, never imported by the server or the tests: it needs llama-cpp-python,
which lives in its own venv. Run it from the repository root:

    LLAMA_VENV/bin/python scripts/record_goldens.py             # every model it can find
    LLAMA_VENV/bin/python scripts/record_goldens.py --only synthetic-qwen3 smollm2

That venv needs numpy and gguf too (the synthetic models are written here by
``tests.fixtures.synthetic_gguf.write_synthetic``, the same code the tests use). Real models
that are not installed are skipped with a note. Each prompt is also run with batch sizes
1 and 7: how far llama.cpp's logits move then (``self_spread``) is its own float noise, the
yardstick tests/inference/engine/test_fidelity.py holds our engine to. Each model gets
``tests/goldens/generation_<name>.json`` holding, per prompt: the text, its token ids as
llama.cpp tokenizes it (special tokens parsed, BOS as the file's metadata says), the prompt's
last-position logits in compact form (top 64, the values at 256 fixed probe ids, mean and
std), and 32 greedy tokens (argmax of llama.cpp's logits, not its sampler) with the top-2
logit margin at each step so a test can forgive a divergence at a near-tie. Greedy decoding
does not stop at end-of-generation tokens: the continuation is still a deterministic function
of the logits.

llama.cpp runs with 2 threads, flash attention off and its default F16 KV cache — the
configuration llama-server users get; the engine rounds the same way (docs/FIDELITY.md).

``--no-repack`` loads every model with llama.cpp's extra buffer types off
(``llama_model_params.use_extra_bufts``): no weight is repacked into the CPU_REPACK buffer, so
every K-quant product is ggml's ``ggml_vec_dot_*_q8_K`` whatever the recording CPU. With them
on (the default, as llama-server runs), which tensors get repacked (``q4_K_8x8`` and its
gemv/gemm, another float order) depends on the recording machine's instruction set and on each
tensor's shape. The setting is stored in the golden's ``settings`` and holds for the batch-size
re-runs too, so ``self_spread`` is measured under the arithmetic the golden was recorded with.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from inference.engine.gguf_file import GGUFFile  # noqa: E402
from tests.fixtures import synthetic_gemma4, synthetic_qwen35  # noqa: E402
from tests.fixtures.synthetic_gguf import (  # noqa: E402
    GENERATOR_VERSION,
    SYNTHETIC_ARCHS,
    synthetic_path,
    tokenizer_source_path,
)

GOLDENS_DIR = REPO_ROOT / "tests" / "goldens"
GREEDY_STEPS = 32
TOP_K = 64
N_PROBES = 256
PROBE_SEED = 20250601
N_THREADS = 2
ALTERNATE_BATCHES = (1, 7)  # llama.cpp re-run with these batch sizes to measure its own float noise

CHATML = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France? Answer in one sentence.<|im_end|>\n"
    "<|im_start|>assistant\n"
)
GEMMA4_CHAT = (
    "<|turn>user\nWhat is the capital of France? Answer in one sentence.<turn|>\n"
    "<|turn>model\n<|channel>thought\n<channel|>"
)
GEMMA_CHAT = (
    "<start_of_turn>user\nWhat is the capital of France? Answer in one sentence.<end_of_turn>\n"
    "<start_of_turn>model\n"
)
PROSE = (
    "The lighthouse keeper climbed the spiral stairs every evening, counting the steps as his "
    "father had taught him. On the night of the great storm, he noticed"
)
# Combining marks: Qwen3.5's pre-tokenizer counts them as letters, Qwen2's does not.
MARKS = "Cafe\u0301 au lait and a na\u0308ive re\u0301sume\u0301 for Zoe\u0308 in Ko\u0308ln."
CODE = 'def is_prime(n: int) -> bool:\n    """Return True when n is a prime number."""\n    if n < 2:\n'


def long_prompt() -> str:
    """A log of 32 numbered entries (about 700 tokens) and a question about an early one,
    so the answer lies outside a 512-token sliding window."""
    colours = ("red", "green", "blue", "yellow", "purple", "orange", "silver", "black")
    animals = ("fox", "heron", "badger", "otter", "falcon", "beaver", "lynx", "salmon", "raven")
    places = ("river", "meadow", "ridge", "harbour", "forest", "quarry", "orchard")
    lines = [
        f"Entry {i + 1}: at {6 + i % 12}:{(7 * i) % 60:02d} the {colours[i % 8]} {animals[i % 9]} "
        f"was seen near the {places[i % 7]}."
        for i in range(32)
    ]
    return "Field notes.\n" + "\n".join(lines) + "\nQuestion: which animal was seen in entry 3? Answer:"


def chat_prompt(model_path: Path) -> str:
    """A one-turn chat in the model's own special tokens (Gemma 4 or Gemma turns, or ChatML)."""
    tokens = GGUFFile(model_path).metadata["tokenizer.ggml.tokens"]
    if "<|turn>" in tokens[:1000]:
        return GEMMA4_CHAT
    return GEMMA_CHAT if "<start_of_turn>" in tokens[:1000] else CHATML


REAL_MODELS = {"smollm2": "smollm2", "gemma3-270m": "gemma3", "qwen2.5-coder-0.5b": "qwen2.5"}
SYNTHETIC_NAMES = (*SYNTHETIC_ARCHS, *synthetic_gemma4.SPECS, *synthetic_qwen35.SPECS)
ALL_NAMES = (*REAL_MODELS, *(f"synthetic-{arch}" for arch in SYNTHETIC_NAMES))


def locate(name: str, work_dir: Path) -> Path | None:
    """The model file for ``name`` (synthetic ones are written now), None when not installed."""
    try:
        if name in REAL_MODELS:
            return tokenizer_source_path(REAL_MODELS[name])
        return synthetic_path(name.removeprefix("synthetic-"), work_dir)
    except FileNotFoundError:  # the model, or the tokenizer a synthetic one borrows, is missing
        return None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def to_json(value, depth: int = 0) -> str:
    """Indented JSON that keeps each flat list (token ids, logits) on one line."""
    pad = " " * (depth + 1)
    if isinstance(value, dict):
        items = ",\n".join(f"{pad}{json.dumps(k)}: {to_json(v, depth + 1)}" for k, v in value.items())
        return "{\n" + items + "\n" + " " * depth + "}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        items = ",\n".join(pad + to_json(v, depth + 1) for v in value)
        return "[\n" + items + "\n" + " " * depth + "]"
    return json.dumps(value, ensure_ascii=False)


def rounded(values) -> list[float]:
    return [round(float(v), 5) for v in values]


class Recorder:
    """One llama.cpp context on one model; greedy decoding from raw logits."""

    def __init__(self, path: Path, n_ctx: int, n_batch: int = 512, repack: bool = True):
        import llama_cpp

        self.llama_cpp = llama_cpp
        self.settings = dict(
            n_ctx=n_ctx, n_batch=n_batch, n_threads=N_THREADS, flash_attn=False, kv_cache_type="f16"
        )
        if not repack:  # (older goldens, recorded before the option, have no such key)
            self.settings["use_extra_bufts"] = False
        with extra_buffer_types(repack):
            self.llm = self._load(path, n_ctx, n_batch)
        self.n_vocab = self.llm.n_vocab()

    def _load(self, path: Path, n_ctx: int, n_batch: int):
        llama_cpp = self.llama_cpp
        return llama_cpp.Llama(
            str(path),
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_ubatch=n_batch,
            n_threads=N_THREADS,
            n_threads_batch=N_THREADS,
            flash_attn=False,
            type_k=llama_cpp.GGML_TYPE_F16,
            type_v=llama_cpp.GGML_TYPE_F16,
            seed=0,
            verbose=False,
        )

    def last_logits(self) -> np.ndarray:
        pointer = self.llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).copy()  # (n_vocab,)

    def tokenize(self, text: str) -> list[int]:
        # add_bos=True means "add the special tokens the vocabulary asks for" in llama.cpp.
        return self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)

    def prompt_logits(self, tokens: list[int]) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(tokens)
        return self.last_logits()  # (n_vocab,)

    def record_prompt(self, name: str, text: str, probe_ids: np.ndarray, others: list[Recorder]) -> dict:
        tokens = self.tokenize(text)
        logits = self.prompt_logits(tokens)  # (n_vocab,)
        if not np.isfinite(logits).all():
            raise RuntimeError(f"{name}: llama.cpp produced non-finite logits")
        top = np.argsort(-logits, kind="stable")[:TOP_K]
        prompt_logits = dict(
            top_ids=[int(i) for i in top],
            top_values=rounded(logits[top]),
            probe_values=rounded(logits[probe_ids]),
            mean=round(float(logits.mean()), 6),
            std=round(float(logits.std()), 6),
            self_spread=self_spread(logits, [o.prompt_logits(tokens) for o in others], top, probe_ids),
        )
        greedy, margins = [], []
        for _ in range(GREEDY_STEPS):
            first, second = np.argsort(-logits, kind="stable")[:2]
            greedy.append(int(first))
            margins.append(float(logits[first] - logits[second]))
            self.llm.eval([int(first)])
            logits = self.last_logits()  # (n_vocab,)
        text_out = self.llm.detokenize(greedy, special=True).decode("utf-8", errors="replace")
        return dict(
            name=name,
            text=text,
            token_ids=tokens,
            prompt_logits=prompt_logits,
            greedy=dict(tokens=greedy, margins=rounded(margins), text=text_out),
        )


@contextlib.contextmanager
def extra_buffer_types(on: bool):
    """Loads inside see llama_model_params.use_extra_bufts = ``on``. llama_cpp.Llama takes no
    argument for it and fills its model params from llama_model_default_params() as it loads,
    so the default-params function is wrapped while the model loads."""
    from llama_cpp import llama_cpp as low

    default = low.llama_model_default_params
    if on:
        yield
        return

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    low.llama_model_default_params = params
    try:
        yield
    finally:
        low.llama_model_default_params = default


def self_spread(logits: np.ndarray, alternates: list[np.ndarray], top: np.ndarray, probes: np.ndarray):
    """How far llama.cpp's own prompt logits move when only the batch size changes (other
    kernels, other summation orders): the float noise a second implementation must be held to."""
    ids = np.concatenate([top, probes])
    diffs = np.array([np.abs(alt[ids] - logits[ids]) for alt in alternates])  # (n_alt, n_ids)
    return dict(
        batch_sizes=list(ALTERNATE_BATCHES),
        max_abs=round(float(diffs.max()), 5),
        mean_abs=round(float(diffs.mean(axis=1).max()), 5),
    )


def prompts_for(name: str, path: Path) -> list[tuple[str, str]]:
    prompts = [("chat", chat_prompt(path)), ("prose", PROSE), ("code", CODE)]
    if "qwen35" in name:  # Qwen3.5's generation prompt opens the think block itself
        prompts[0] = ("chat", CHATML + "<think>\n")
        prompts.append(("marks", MARKS))
    if "gemma3" in name or "qwen35" in name:  # long enough for many DeltaNet steps, two ubatches of 512
        prompts.append(("long", long_prompt()))
    return prompts


def record_model(name: str, path: Path, synthetic: bool, repack: bool = True) -> dict:
    import llama_cpp

    prompts = prompts_for(name, path)
    n_ctx = 1024 if any(p == "long" for p, _ in prompts) else 512
    recorder = Recorder(path, n_ctx, repack=repack)
    others = [Recorder(path, n_ctx, n_batch, repack=repack) for n_batch in ALTERNATE_BATCHES]
    probe_ids = np.sort(np.random.default_rng(PROBE_SEED).choice(recorder.n_vocab, N_PROBES, replace=False))
    golden = dict(
        name=name,
        model_file=path.name,
        sha256=sha256_of(path),
        synthetic=synthetic,
        architecture=recorder.llm.metadata.get("general.architecture"),
        n_vocab=recorder.n_vocab,
        llama_cpp_version=llama_cpp.__version__,
        # The build's SIMD flavour: its vector expf (SiLU, softmax) rounds differently with
        # AVX-512 than with AVX2, the one the engine reproduces (docs/FIDELITY.md).
        system_info=llama_cpp.llama_print_system_info().decode().strip(),
        settings=recorder.settings,
        greedy_steps=GREEDY_STEPS,
        probe_seed=PROBE_SEED,
        probe_ids=[int(i) for i in probe_ids],
        prompts=[recorder.record_prompt(p_name, text, probe_ids, others) for p_name, text in prompts],
    )
    if synthetic:
        key = name.removeprefix("synthetic-")
        own = next((m for m in (synthetic_gemma4, synthetic_qwen35) if key in m.SPECS), None)
        golden["generator_version"] = own.GENERATOR_VERSION if own else GENERATOR_VERSION
        golden["synthetic_arch"] = key  # what synthetic_path takes (a SPECS key; not always the arch)
    for r in [recorder, *others]:
        r.llm.close()
    return golden


def summarize(golden: dict) -> str:
    lines = [f"{golden['name']}: {golden['model_file']} ({golden['architecture']})"]
    for prompt in golden["prompts"]:
        margins = np.array(prompt["greedy"]["margins"])
        distinct = len(set(prompt["greedy"]["tokens"]))
        lines.append(
            f"  {prompt['name']:5s} {len(prompt['token_ids']):4d} prompt tokens, {distinct:2d} distinct of "
            f"{GREEDY_STEPS}, margin min {margins.min():.3f} median {np.median(margins):.3f}: "
            f"{prompt['greedy']['text'][:90]!r}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=ALL_NAMES, help="record only these models")
    parser.add_argument("--out", type=Path, default=GOLDENS_DIR, help="where the JSON files go")
    parser.add_argument(
        "--no-repack",
        action="store_true",
        help="load with llama.cpp's extra (repacked) buffer types off: every K-quant product is "
        "ggml_vec_dot_*_q8_K on any CPU (stored in the golden's settings)",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lmserve-synthetic-") as work_dir:
        for name in args.only or ALL_NAMES:
            path = locate(name, Path(work_dir))
            if path is None:
                print(f"{name}: not installed, skipped", file=sys.stderr)
                continue
            golden = record_model(name, path, synthetic=name not in REAL_MODELS, repack=not args.no_repack)
            target = args.out / f"generation_{name}.json"
            target.write_text(to_json(golden) + "\n", encoding="utf-8")
            print(summarize(golden), flush=True)
            print(f"  -> {target} ({target.stat().st_size} bytes)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
