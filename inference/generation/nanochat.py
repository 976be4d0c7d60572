"""The nanochat backend: a nanochat checkpoint (``lmserve --nanochat DIR``) behind the same
two-sided contract as every backend (``backends.GenerationBackend``).

It does not ride the GGUF Engine: nanochat has its own tokenizer, its own cache and a chat
protocol of special tokens rather than a template (nanochat's chat_cli.py / the reference's
``backend_nanochat.zig``):

    <|bos|> (<|user_start|> text <|user_end|> | <|assistant_start|> text <|assistant_end|>)*
    <|assistant_start|>

The reply ends at ``<|assistant_end|>`` or ``<|bos|>`` (neither is part of it). The model's
calculator runs inside the reply (nanochat_tools.py); its markers stream as their text, as
the reference streams them. In an assistant turn of the history those four markers become
their special tokens again, so a conversation replays as the model wrote it; a user's text
never becomes a special token.

What it cannot honour is refused with a 400 naming it: a system (or developer) message (the
SFT protocol has none), tool results, and grammars. Each request runs on a fresh cache, as
in the reference: there is no reuse of KV rows across requests and no lockstep batch.
"""

from __future__ import annotations

import logging

import regex

from inference.engine.models.nanochat import NanochatCache
from inference.engine.nanochat_checkpoint import NanochatCheckpoint
from inference.engine.sampler import Sampler, SamplingParams
from inference.generation.backend import Sink, budgeted
from inference.generation.capabilities import Capabilities
from inference.generation.emitter import ReplyEmitter
from inference.generation.nanochat_tools import CalculatorState
from inference.types import (
    Error,
    Finish,
    GenerationRequest,
    Message,
    PreparedPrompt,
    Usage,
)

logger = logging.getLogger("lmserve.nanochat")

# nanochat's own generation defaults (engine.py / the reference's GenParams).
NANOCHAT_SAMPLING = SamplingParams(temperature=0.6, top_k=50, seed=42)
CAPABILITIES = Capabilities(
    tools=False, reasoning=False, grammar=False, kv_reuse=False, batch=False, spec=False, embeddings=False
)
TOOL_MARKERS = ("<|python_start|>", "<|python_end|>", "<|output_start|>", "<|output_end|>")
PREFILL_CHUNK = 256  # prompt tokens per forward
_MARKER_SPLIT = regex.compile("(" + "|".join(regex.escape(m) for m in TOOL_MARKERS) + ")")


class NanochatBackend:
    """Serves one nanochat checkpoint: validate on the connection side, generate on the
    worker thread."""

    engine = None  # no GGUF engine: nothing else (embeddings, KV prefixes) is served
    slots = None  # no warm KV slots

    def __init__(self, checkpoint: NanochatCheckpoint, n_ctx: int):
        self.checkpoint = checkpoint
        self.model = checkpoint.model
        self.tokenizer = checkpoint.tokenizer
        self.n_ctx = n_ctx
        self.defaults = NANOCHAT_SAMPLING
        special = self.tokenizer.special_id
        self.bos = special("<|bos|>")
        self.user = (special("<|user_start|>"), special("<|user_end|>"))
        self.assistant = (special("<|assistant_start|>"), special("<|assistant_end|>"))
        self.terminal = frozenset((self.bos, self.assistant[1]))

    # The calculator is built in (declared function tools are refused); no GGUF engine to embed with.
    capabilities = CAPABILITIES

    def release(self) -> None:
        """Nothing to give back: every request's cache is its own."""

    # -- connection side ------------------------------------------------------------------
    def tokenize(self, request: GenerationRequest) -> list[int] | Error:
        """The conversation in nanochat's protocol, ending with the opened assistant turn
        (and the client's prefill, if any, which the reply continues). A raw prompt is refused:
        the checkpoint is served as a chat model only."""
        if request.raw is not None:
            param = request.raw.param
            message = f"'{param}' is not supported: a nanochat checkpoint is served for chat only"
            return Error(400, message, code="unsupported_parameter", param=param)
        tokens = [self.bos]
        for index, message in enumerate(request.messages):
            refused = _refuse_role(message, index)
            if refused is not None:
                return refused
            if message.role == "user":
                tokens += [self.user[0], *self.tokenizer.encode(message.content), self.user[1]]
            else:
                tokens += [self.assistant[0], *self._assistant_text(message.content), self.assistant[1]]
        tokens.append(self.assistant[0])
        return tokens + self._assistant_text(request.prefill)

    def _assistant_text(self, text: str) -> list[int]:
        """An assistant turn's tokens: its calculator markers as their special tokens."""
        ids: list[int] = []
        for part in _MARKER_SPLIT.split(text):
            if part in TOOL_MARKERS:
                ids.append(self.tokenizer.special_id(part))
            elif part:
                ids += self.tokenizer.encode(part)
        return ids

    def validate(self, request: GenerationRequest) -> PreparedPrompt | Error:
        """Refuse what nanochat cannot honour, then check the prompt leaves room to reply."""
        if request.constraint is not None:
            param = request.constraint.param
            message = f"'{param}' is not supported: nanochat has no grammar-constrained decoding"
            return Error(400, message, code="unsupported_parameter", param=param)
        if request.logprobs is not None:
            param = request.logprobs.param
            message = f"'{param}' is not supported: the nanochat backend reports no log probabilities"
            return Error(400, message, code="unsupported_parameter", param=param)
        tokens = self.tokenize(request)
        if isinstance(tokens, Error):
            return tokens
        return budgeted(tokens, self.n_ctx, request.max_tokens)

    # -- worker side ----------------------------------------------------------------------
    def generate(self, request: GenerationRequest, prompt: PreparedPrompt, sink: Sink) -> int:
        """Stream the reply into ``sink`` and close it (Finish, or Error on a failure).
        Returns the number of tokens generated."""
        run = _Reply(self, request, prompt, sink)
        try:
            run.run()
        except Exception as exc:  # a failure ends this request, not the server
            logger.error("nanochat generation failed", exc_info=exc)
            if not sink.cancelled:
                sink.close(
                    Error(500, f"generation failed: {type(exc).__name__}: {exc}", code="internal_error")
                )
        return run.generated

    def warm_up(self) -> None:
        """One tiny forward, so a broken checkpoint fails at start-up rather than on a request."""
        cache = self.model.new_cache(4)
        self.model.forward(cache, [self.bos, self.user[0]])
        self.model.forward(cache, [self.user[1]])


def _refuse_role(message: Message, index: int) -> Error | None:
    if message.role in ("user", "assistant"):
        return None
    if message.role == "system":
        why = "nanochat has no system role (its chat protocol has user and assistant turns only)"
    else:
        why = f"nanochat has no {message.role!r} role (its calculator is built in; it takes no tool results)"
    return Error(400, f"messages[{index}]: {why}", code="invalid_value", param="messages")


class _Reply:
    """One reply's decode loop: sample (or take the calculator's forced token), stream it,
    feed it back; the reference's Engine.generate for one row."""

    def __init__(
        self, backend: NanochatBackend, request: GenerationRequest, prompt: PreparedPrompt, sink: Sink
    ):
        self.backend, self.request, self.prompt, self.sink = backend, request, prompt, sink
        self.sampler = Sampler(request.sampling.resolve(backend.defaults))
        self.emitter = ReplyEmitter(stop=request.stop)
        self.tools = CalculatorState(backend.tokenizer)
        self.history = list(prompt.tokens)
        self.generated = 0

    def run(self) -> None:
        model = self.backend.model
        cache: NanochatCache = model.new_cache(len(self.prompt.tokens) + self.prompt.max_tokens)
        logits = self._prefill(cache)
        if logits is None:
            return
        reason = "length"
        while self.generated < self.prompt.max_tokens:
            if self.sink.cancelled:
                return
            token = self.tools.next_forced()
            if token is None:
                token = self.sampler.sample(logits, self.history)
            if token in self.backend.terminal and not self.request.ignore_eos:
                reason = "stop"
                break
            if self._emit(token):
                reason = "stop"
                break
            if self.generated < self.prompt.max_tokens:
                logits = model.forward(cache, [token])[-1]
        self._finish(reason)

    def _prefill(self, cache: NanochatCache):
        """The last prompt position's logits (vocab,), the prompt fed in chunks (attention
        scores stay chunk x context, and a hang-up is seen between chunks); None if cancelled."""
        tokens = self.prompt.tokens
        for start in range(0, len(tokens), PREFILL_CHUNK):
            if self.sink.cancelled:
                return None
            logits = self.backend.model.forward(cache, tokens[start : start + PREFILL_CHUNK])
        return logits[-1]

    def _emit(self, token: int) -> bool:
        """Stream one token; True when a stop string ended the reply."""
        self.generated += 1
        self.history.append(token)
        self.tools.observe(token)
        for event in self.emitter.feed(self.backend.tokenizer.token_bytes(token)):
            self.sink.push(event)
        return self.emitter.stopped

    def _finish(self, reason: str) -> None:
        if self.sink.cancelled:
            return
        for event in self.emitter.flush():
            self.sink.push(event)
        usage = Usage(len(self.prompt.tokens), self.generated)
        self.sink.close(Finish(reason, usage, stop_sequence=self.emitter.stopped_by))
