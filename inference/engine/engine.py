"""The engine facade: one loaded GGUF model with its tokenizer, chat template and sampler.

Typical use::

    engine = Engine.load("SmolLM2-135M-Instruct.Q4_1.gguf")
    cache = engine.new_cache(4096)
    prompt = engine.encode_prompt(engine.render_chat([{"role": "user", "content": "Hi"}]))
    logits = engine.prefill(cache, prompt)  # (vocab,) after the prompt
    logits = engine.decode_one(cache, int(logits.argmax()))

The engine computes logits (``prefill``, ``decode_one``, ``decode_batch``, ``verify``); the
decode loop that samples, stops and streams is inference.generation's ``DecodeStream``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from .chat_template import ChatTemplate, map_strings, unused_mark
from .families import Family, family_of
from .fingerprint import model_fingerprint
from .fused import step_region
from .gguf_file import GGUFFile
from .heap import loading_heap
from .jit import stage_calls
from .jit.numba_cache import use_keyed_cache_dir
from .kv_cache import KVCache
from .load_options import ExpertMode, LoadOptions
from .models import DecoderModel
from .models.base import Run
from .quants.dequant import PARALLEL_ROWS
from .sampler import SamplingParams
from .tokenizer import Tokenizer, load_tokenizer

logger = logging.getLogger(__name__)

# Tensors holding routed experts (n_expert, rows, cols); the shared experts (_shexp) are not.
EXPERT_SUFFIXES = ("_exps.weight",)

PREFILL_CHUNK = 256  # tokens per forward during prefill: bounds activation memory

GGUF_SAMPLING_KEYS = {
    "temp": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "penalty_repeat": "repeat_penalty",
    "penalty_last_n": "repeat_last_n",
}


@dataclass(frozen=True)
class BatchRow:
    """One conversation's next token in a lockstep batch: appended to its own cache."""

    cache: KVCache
    token: int


def _load_model(family: Family, f: GGUFFile) -> DecoderModel:
    """The family's model of ``f``. On a cold numba cache the second compiling process starts
    first (step_region.compile_ahead): it compiles the fused forward while this one reads the
    weights, and is stopped if the model has no fused forward after all."""
    if family.model.may_fuse():
        step_region.compile_ahead()
    model = None
    try:
        model = family.model(f)
    finally:
        if getattr(model, "fused", None) is None:
            stage_calls.cancel_early()
    return model


class Engine:
    """A model ready to generate. Not thread-safe: one worker thread owns it."""

    def __init__(
        self,
        path: str | os.PathLike,
        file: GGUFFile,
        model: DecoderModel,
        tokenizer: Tokenizer,
        family: Family,
    ):
        self.path = Path(path)
        self.file = file
        self.model = model
        self.config = model.config
        self.tokenizer = tokenizer
        self.family = family
        self.chat_template = ChatTemplate.from_metadata(file.metadata, family.template_fallback)
        # The vocabulary's end-of-generation ids plus the family's own stop tokens.
        extra = {tokenizer.token_id(text) for text in family.stop_tokens}
        self.stop_ids: frozenset[int] = tokenizer.eog_ids | frozenset(i for i in extra if i is not None)
        # The family's think markers stay visible in the reply text even where they are control
        # tokens (inkling's typed blocks), so the emitter can route the block they open. A family
        # whose markers are spelled out of several tokens (``ThinkTags.special``, gemma4) shows
        # its control tokens only while the think head is open (generation/stream.py).
        think = family.think
        markers = (think.open, think.close) if think is not None and not think.special else ()
        self._shown_ids = frozenset(
            i for i in map(tokenizer.token_id, markers) if i is not None and tokenizer.is_control(i)
        )

    @classmethod
    def load(cls, path: str | os.PathLike, options: LoadOptions | None = None) -> Engine:
        """Open, map and prepare the model; raises GGUFError with a clear message. ``options``
        say how weights are read (e.g. MoE experts borrowed from the mapped file)."""
        use_keyed_cache_dir()  # the kernels this model compiles go to (and come from) the keyed cache
        f = GGUFFile(path, options)
        family = family_of(f)
        with loading_heap():  # the repacked temporaries' pages do not outlive the load
            model = _load_model(family, f)
        engine = cls(path, f, model, load_tokenizer(f.metadata), family)
        f.release_pages()  # the weights are in the arena now: only what is still read maps back
        if f.options.experts is ExpertMode.BORROW and not engine.has_routed_experts:
            logger.info("--experts=borrow: %s has no routed experts, nothing to borrow", engine.path.name)
        elif f.options.experts is ExpertMode.BORROW:
            logger.info(
                "--experts=borrow: routed experts stay in the mapped file, converted when picked "
                "(the last %d kept per expert tensor)",
                f.options.expert_cache,
            )
        return engine

    @property
    def has_routed_experts(self) -> bool:
        """Whether the file has routed expert tensors (the ones ``--experts`` applies to)."""
        return any(name.endswith(EXPERT_SUFFIXES) for name in self.file.tensors)

    @property
    def expert_mode(self) -> str | None:
        """How routed experts are held ("repack" or "borrow"), None for a model without them."""
        return self.file.options.experts.value if self.has_routed_experts else None

    @property
    def serving_bytes(self) -> int:
        """Memory the model takes beyond what it holds after the load, once it serves: the
        mapped pages of borrowed experts (the page cache must keep them) and their caches of
        converted experts, full. 0 for a model that holds all its weights."""
        return sum(borrower.serving_bytes for borrower in self.file.borrowers)

    @property
    def model_id(self) -> str:
        return self.path.name.removesuffix(".gguf")

    @cached_property
    def fingerprint(self) -> bytes:
        """16 bytes telling this model's weights apart from any other's (see fingerprint.py)."""
        return model_fingerprint(self.file)

    def recommended_sampling(self) -> SamplingParams:
        """The GGUF's general.sampling.* values, else the family's, else llama.cpp's defaults."""
        base = self.family.sampling
        found = {
            field: type(getattr(base, field))(self.file.metadata[f"general.sampling.{key}"])
            for key, field in GGUF_SAMPLING_KEYS.items()
            if f"general.sampling.{key}" in self.file.metadata
        }
        return SamplingParams(**{**base.__dict__, **found})

    # -- text ------------------------------------------------------------------------------
    def render_chat(self, messages: list[dict], tools: list[dict] | None = None, **extra) -> str:
        """The conversation as prompt text, ending where the assistant's reply begins.

        When the tokenizer adds BOS itself, a BOS the template wrote is dropped (as llama.cpp's
        chat path does), so the prompt never starts with two."""
        text = self.chat_template.render(messages, add_generation_prompt=True, tools=tools, **extra)
        tok = self.tokenizer
        if tok.add_bos and tok.bos_id is not None:
            bos_text = tok.token_text(tok.bos_id)
            if bos_text and text.startswith(bos_text):
                text = text[len(bos_text) :]
        return text

    def encode_chat(
        self, messages: list[dict], tools: list[dict] | None = None, continuation: str = "", **extra
    ) -> list[int]:
        """The conversation rendered and tokenized with only the template's own markers as
        special tokens: a control token's text inside a message, a tool result or a tool
        declaration stays plain text (else a user could forge role markers). The strings are
        marked before rendering, so the template may still transform them (trim, split).
        ``continuation`` (plain text too) is appended after the generation prompt: the start
        of the assistant's reply, which the model continues."""
        mark = unused_mark([messages, continuation], tools)

        def plain(text: str) -> str:
            return self.tokenizer.mark_plain(text, mark)

        text = self.render_chat(map_strings(messages, plain), tools=map_strings(tools, plain), **extra)
        text += plain(continuation)
        return self.tokenizer.encode(
            text, add_bos=self.tokenizer.add_bos, parse_special=True, plain_mark=mark
        )

    def reply_bytes(self, token: int) -> bytes:
        """A generated token's bytes as the reply text holds them: control tokens are none,
        except the family's think markers (see ``__init__``)."""
        return self.tokenizer.token_bytes(token, special=token in self._shown_ids)

    def encode_prompt(self, text: str) -> list[int]:
        """Tokenize a whole prompt: special tokens parsed, BOS as the model's metadata says."""
        return self.tokenizer.encode(text, add_bos=self.tokenizer.add_bos, parse_special=True)

    # -- compute ---------------------------------------------------------------------------
    def new_cache(self, n_ctx: int) -> KVCache:
        return self.model.new_cache(n_ctx)

    def prefill(self, cache: KVCache, tokens: Sequence[int]) -> np.ndarray:
        """Append ``tokens`` to ``cache``; return the logits after the last one (vocab,)."""
        logits = None
        for i in range(0, len(tokens), PREFILL_CHUNK):
            logits = self.model.forward(list(tokens[i : i + PREFILL_CHUNK]), cache)
        if logits is None:
            raise ValueError("prefill needs at least one token")
        cache.prefill_logits = (cache.n_tokens, logits)
        return logits

    def warm_up(self) -> None:
        """Run the forward kernels once on a scratch cache (PARALLEL_ROWS tokens prefilled, one
        decoded), so numba compiles them, or loads them from its disk cache, now: not inside the
        first request's prefill, whose rate the caller would report. That many tokens: a prompt
        of fewer gathers its embedding rows on one thread, a longer one with a kernel of its own."""
        cache = self.new_cache(PARALLEL_ROWS + 2)
        token = self.tokenizer.bos_id if self.tokenizer.bos_id is not None else 0
        self.prefill(cache, [token] * PARALLEL_ROWS)
        self.decode_one(cache, token)

    def embed(self, tokens: Sequence[int]) -> np.ndarray:
        """The embedding of a token sequence (n_embd,) float32: the final-norm hidden state of
        the last token (after the final RMS norm, before the output head), L2-normalised.
        Runs on a fresh cache of its own, prefilled in the usual chunks."""
        if not len(tokens):
            raise ValueError("an embedding needs at least one token")
        cache = self.new_cache(len(tokens))
        last = (len(tokens) - 1) // PREFILL_CHUNK * PREFILL_CHUNK
        for i in range(0, last, PREFILL_CHUNK):
            self.model.forward(list(tokens[i : i + PREFILL_CHUNK]), cache)
        hidden = self.model.final_hidden(list(tokens[last:]), cache).astype(np.float32)  # (n_embd,)
        norm = float(np.linalg.norm(hidden))
        if not np.isfinite(norm) or norm == 0.0:
            raise ValueError("the model's hidden state has no direction (zero or non-finite)")
        return hidden / np.float32(norm)

    def decode_one(self, cache: KVCache, token: int) -> np.ndarray:
        """Append one token; the logits after it (vocab,)."""
        return self.model.forward([token], cache)

    def decode_batch(self, rows: Sequence[BatchRow]) -> np.ndarray:
        """One token for each of several conversations (distinct caches, any positions) in one
        forward; logits (len(rows), vocab), each row bitwise what ``decode_one`` gives."""
        return np.stack(self.model.forward_runs([Run(row.cache, [row.token]) for row in rows]))

    def verify(self, cache: KVCache, tokens: Sequence[int]) -> np.ndarray:
        """Append a short run of tokens (a draft) and return the logits after each one
        (len(tokens), vocab), bitwise what decoding them one by one gives. Keep the first k
        with ``cache.truncate(n_before + k)``: the rows after it are forgotten."""
        return self.model.forward(list(tokens), cache, all_logits=True)

    def forward(self, runs: Sequence[Run]) -> list[np.ndarray]:
        """The general primitive: each run's tokens appended to its own cache in one forward
        (see DecoderModel.forward_runs)."""
        return self.model.forward_runs(runs)

    def reuse_prefix(self, cache: KVCache, prompt: Sequence[int]) -> int:
        """Keep the cached rows the prompt starts with; return how many were kept. At least
        one token is left to run, unless the whole prompt is cached together with the logits
        that followed it."""
        keep = cache.common_prefix(list(prompt))
        saved = cache.prefill_logits
        if keep == len(prompt) and not (saved is not None and saved[0] == keep):
            keep -= 1
        cache.truncate(keep)
        return keep
