"""The block-diffusion backend (``backends.BACKENDS["diffusion"]``): DiffusionGemma replies.

The model does not decode token by token: it denoises canvases of ``diffusion.canvas_length``
tokens with the entropy-bound sampler (``inference/engine/diffusion_sampler.py``) and commits
them block by block, so a reply streams one text delta per committed block. What per-token
serving offers and a denoiser cannot honour is refused on the connection side with a 400
naming the parameter: a grammar (response_format, forced tool calls: token masking has no
seam in the denoiser), stop strings and ignore_eos (a block ends at its first end-of-generation
token). Sampling fields other than ``seed`` are accepted and ignored, as the reference
server does: the temperature schedule is the model's own, and clients (SDKs, the chat page)
send a temperature by habit.
Tools and reasoning are refused by the dialects (this backend reports neither). Every request
starts on a fresh cache: no KV reuse, no slots.
"""

from __future__ import annotations

import logging

import numpy as np

from inference.engine.diffusion_sampler import generate_blocks
from inference.engine.engine import Engine
from inference.generation.backend import DEFAULT_MAX_TOKENS, Sink, openai_overflow_message
from inference.generation.capabilities import Capabilities
from inference.generation.emitter import TextEmitter
from inference.types import (
    ContextOverflow,
    Error,
    Finish,
    GenerationRequest,
    Message,
    PreparedPrompt,
    TextDelta,
    Usage,
)

logger = logging.getLogger("lmserve.diffusion")


def unsupported(param: str, why: str) -> Error:
    return Error(400, f"'{param}' {why}", code="unsupported_parameter", param=param)


def refusal(request: GenerationRequest) -> Error | None:
    """The first thing ``request`` asks that block diffusion cannot do, as a 400; else None."""
    if request.constraint is not None:
        return unsupported(request.constraint.param, "cannot be honoured: a diffusion model has no grammar")
    if request.stop:
        return unsupported(
            request.stop_param, "cannot be honoured: a diffusion model ends at end-of-generation tokens"
        )
    if request.ignore_eos:
        return unsupported(
            "ignore_eos", "cannot be honoured: a diffusion model ends at end-of-generation tokens"
        )
    if request.logprobs is not None:
        return unsupported(
            request.logprobs.param,
            "cannot be honoured: a diffusion model commits whole blocks, not tokens drawn one at a time",
        )
    return None


class DiffusionBackend:
    """Serves a ``diffusion-gemma`` model: one request at a time on a fresh cache, one delta
    per committed block."""

    slots = None  # no warm KV slots: nothing is reused across requests

    def __init__(self, engine: Engine, n_ctx: int):
        self.engine = engine
        self.model = engine.model
        self.n_ctx = n_ctx
        self.canvas = engine.model.diffusion.canvas_length
        self.capabilities = Capabilities.of_engine(engine)  # the family's: no grammar, reuse, batch

    # -- connection side -------------------------------------------------------------------

    def release(self) -> None:
        """Nothing is held between requests."""

    def tokenize(self, request: GenerationRequest) -> list[int] | Error:
        """The conversation through the chat template, tokenized (an assistant prefill
        continues the opened turn)."""
        from inference.engine.chat_template import ChatTemplateError
        from inference.generation.prompts import raw_prompt_tokens

        if request.raw is not None:
            return raw_prompt_tokens(self.engine, request.raw, self.n_ctx, request.max_tokens)
        try:
            return self.engine.encode_chat(request.template_messages(), continuation=request.prefill)
        except ChatTemplateError as exc:
            return Error(400, f"the model's chat template rejected the messages: {exc}", param="messages")

    def validate(self, request: GenerationRequest) -> PreparedPrompt | Error:
        """Refuse what the denoiser cannot honour; tokenize; the prompt plus one canvas must
        fit the context, and the budget is cut to the whole canvases that fit after it."""
        refused = refusal(request)
        if refused is not None:
            return refused
        tokens = self.tokenize(request)
        if isinstance(tokens, Error):
            return tokens
        blocks = (self.n_ctx - len(tokens)) // self.canvas
        if blocks < 1:
            overflow = ContextOverflow(len(tokens), self.n_ctx - self.canvas)
            needs = f" (a diffusion reply needs room for a {self.canvas}-token canvas)"
            message = openai_overflow_message(overflow) + needs
            param = request.raw.param if request.raw is not None else "messages"
            return Error(400, message, code="context_length_exceeded", param=param, overflow=overflow)
        wanted = request.max_tokens if request.max_tokens is not None else DEFAULT_MAX_TOKENS
        return PreparedPrompt(tokens, min(wanted, blocks * self.canvas))

    # -- worker side -----------------------------------------------------------------------
    def generate(self, request: GenerationRequest, prompt: PreparedPrompt, sink: Sink) -> int:
        """Stream the reply block by block into ``sink`` and close it with Finish (Error on a
        failure, nothing once cancelled). Returns the number of tokens generated."""
        seed = request.sampling.seed
        seed = int(np.random.SeedSequence().entropy) if seed is None else seed
        emitter, produced, finished = TextEmitter(), 0, False
        try:
            cache = self.engine.new_cache(self.n_ctx)
            blocks = generate_blocks(
                self.model,
                cache,
                prompt.tokens,
                prompt.max_tokens,
                self.engine.stop_ids,
                seed % (1 << 64),
                lambda: sink.cancelled,
            )
            for block in blocks:
                produced += len(block.tokens)
                finished = block.finished
                last = finished or produced >= prompt.max_tokens
                text = "".join(emitter.feed(self.engine.tokenizer.token_bytes(t)) for t in block.tokens)
                text += emitter.flush() if last else ""
                if text and not sink.cancelled:
                    sink.push(TextDelta(text))
        except Exception as exc:  # an engine failure ends this request, not the server
            logger.error("diffusion generation failed", exc_info=exc)
            sink.close(Error(500, f"generation failed: {type(exc).__name__}: {exc}", code="internal_error"))
            return produced
        if not sink.cancelled:
            usage = Usage(len(prompt.tokens), produced)
            sink.close(Finish("stop" if finished else "length", usage))
        return produced

    def warm_up(self) -> None:
        """Compile the kernels before the first request: the encoder pass of a tiny prompt
        and one canvas pass."""
        prepared = self.validate(GenerationRequest(messages=(Message("user", "Hi"),), max_tokens=1))
        if isinstance(prepared, Error):
            raise RuntimeError(f"warm-up prompt rejected: {prepared.message}")
        cache = self.engine.new_cache(len(prepared.tokens) + self.canvas)
        self.model.encode(prepared.tokens, cache)
        self.model.canvas_forward(np.zeros(self.canvas, np.int64), cache)
