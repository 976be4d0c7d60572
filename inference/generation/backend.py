"""The conversation backend: how one loaded model serves a GenerationRequest.

Two halves, as every backend has: ``validate`` runs on the connection side before a job is
queued (render the chat template, tokenize, check the context: cheap, and a failure here is a
plain 400 before any model work), and ``generate`` runs on the worker thread (pick a warm KV
slot, prefill, decode, stream text through the emitter into the request's sink).

With a prefix source (``--cartridge``, a fleet), the worker side first asks it which KV prefix
the conversation runs behind (PrefixChoice); the prefix's rows take room in the context but are
never prompt tokens: usage and ``cached_tokens`` count the real tokens past them.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from inference.engine.engine import Engine
from inference.engine.kv_cache import KVCache
from inference.generation.capabilities import Capabilities
from inference.generation.constraints import ConstraintCompiler, ConstraintSpec, bound_number_digits
from inference.generation.lockstep import Joins, run_lockstep
from inference.generation.prompts import raw_prompt_tokens
from inference.generation.speculative import Speculator
from inference.generation.stream import BatchItem, DecodeStream, GenerationStats, Recorder
from inference.generation.toolcall import ToolSpec, auto_call_grammar, resolve_forced_call
from inference.kv.disk import SidecarStore
from inference.kv.prefix_source import PrefixChoice, PrefixSource
from inference.kv.slots import SlotPool
from inference.types import (
    ContextOverflow,
    Error,
    GenerationRequest,
    Message,
    PreparedPrompt,
    Sink,
)

DEFAULT_MAX_TOKENS = 1024
CALL_GRAMMAR_VERDICTS = 256  # schemas and tool sets llguidance was asked about, remembered per backend
logger = logging.getLogger("lmserve.backend")


def openai_overflow_message(overflow: ContextOverflow) -> str:
    """OpenAI's wording of a context overflow, older and newer, so clients that match either
    (litellm, LangChain, the Agents SDK) recognise it; the Anthropic dialect words it its own way."""
    return (
        f"This model's maximum context length is {overflow.n_ctx} tokens. However, your messages "
        f"resulted in {overflow.prompt_tokens} tokens. Please reduce the length of the messages. "
        f"Input tokens exceed the configured limit of {overflow.n_ctx} tokens (this server's --ctx)."
    )


def budgeted(
    tokens: list[int], n_ctx: int, max_tokens: int | None, param: str = "messages"
) -> PreparedPrompt | Error:
    """The prompt with its reply budget (``max_tokens``, else the default, capped by the room
    left in ``n_ctx``), or a 400 naming ``param`` when the prompt leaves no room to reply."""
    room = n_ctx - len(tokens)
    if room < 1:
        overflow = ContextOverflow(len(tokens), n_ctx)
        message = openai_overflow_message(overflow)
        return Error(400, message, code="context_length_exceeded", param=param, overflow=overflow)
    wanted = max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS
    return PreparedPrompt(tokens, min(wanted, room))


def prompt_param(request: GenerationRequest) -> str:
    """The field a prompt that does not fit is reported on."""
    return request.raw.param if request.raw is not None else "messages"


@dataclass
class ServingTotals:
    """What the generations served so far did, summed as each ends (llama.cpp's /metrics
    counters): prompt tokens prefilled and the seconds it took, tokens generated and the
    seconds from the first to the last, speculation's drafted and accepted tokens. Written by
    the worker thread only; read at scrape time."""

    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    predicted_tokens: int = 0
    predicted_seconds: float = 0.0
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    def add(self, stats: GenerationStats) -> None:
        self.prompt_tokens += stats.prefilled_tokens
        self.prompt_seconds += stats.prefill_seconds
        self.predicted_tokens += stats.generated_tokens
        self.predicted_seconds += stats.decode_seconds
        self.drafted_tokens += stats.spec_drafted
        self.accepted_tokens += stats.spec_accepted


class CachePolicy(Protocol):
    """Where a request's cache comes from and what stays behind it: warm slots reused across
    requests (:class:`SlotCaches`) or a fresh cache per request
    (:class:`~inference.generation.recurrent.FreshCaches`)."""

    slots: SlotPool | None  # the warm slots (the admin lists and evicts them), or None

    def acquire(self, prompt: PreparedPrompt, choice: PrefixChoice | None) -> KVCache:
        """The cache a request's prompt is prefilled into, behind ``choice``'s prefix."""

    def release(self) -> None:
        """After a job: the caches it used are given back."""

    def finish(self, cache: KVCache) -> None:
        """One stream of a lockstep batch ended: its cache may go to a stream that joins."""

    def scratch(self, tokens: list[int]) -> KVCache:
        """A cache for the warm-up's tiny generation of ``tokens`` (then :meth:`discard`)."""

    def discard(self, cache: KVCache) -> None:
        """Forget ``cache``'s rows (a warm-up's, or a stream's whose rows are undefined)."""


class SlotCaches:
    """Warm KV slots: a request continues the slot whose rows fit its prompt best. A family
    whose state cannot be cut back to a prefix (``kv_reuse`` false) starts the slot clean."""

    def __init__(self, engine: Engine, n_ctx: int, kv_slots: int, disk: SidecarStore | None, kv_reuse: bool):
        self.slots = SlotPool(lambda: engine.new_cache(n_ctx), kv_slots, disk)
        self.kv_reuse = kv_reuse

    def acquire(self, prompt: PreparedPrompt, choice: PrefixChoice | None) -> KVCache:
        cache = self.slots.acquire(prompt.tokens, choice)
        if not self.kv_reuse:
            self.slots.reset(cache)
        return cache

    def release(self) -> None:
        self.slots.release()

    def finish(self, cache: KVCache) -> None:
        self.slots.release_cache(cache)

    def scratch(self, tokens: list[int]) -> KVCache:
        return self.slots.acquire(tokens)

    def discard(self, cache: KVCache) -> None:
        self.slots.reset(cache)


class ConversationBackend:
    """Chat-template prompting and per-token decoding over an Engine: the generic backend
    (``backends.BACKENDS["conversation"]``), and with a fresh cache per request
    (``caches``) the recurrent one. Where caches come from is its :class:`CachePolicy`; what
    it does is its ``capabilities``."""

    def __init__(
        self,
        engine: Engine,
        n_ctx: int,
        kv_slots: int = 1,
        disk: SidecarStore | None = None,
        prefix_source: PrefixSource | None = None,
        spec: bool = False,
        caches: CachePolicy | None = None,
    ):
        """``prefix_source``: the KV prefix (cartridge, fleet composition) every conversation
        runs behind. ``spec``: decode a request served alone speculatively (the same reply,
        faster where drafts hit); a lockstep batch of two or more decodes plain. ``caches``:
        where requests' caches come from (default: ``kv_slots`` warm slots over ``disk``)."""
        self.engine = engine
        self.prefix_source = prefix_source
        self.family = engine.family
        self.n_ctx = n_ctx
        self.defaults = engine.recommended_sampling()
        if caches is None:
            caches = SlotCaches(engine, n_ctx, kv_slots, disk, kv_reuse=self.family.kv_reuse)
        self.caches = caches
        self.constraints = ConstraintCompiler(engine.tokenizer, stop_ids=engine.stop_ids)
        self.speculator = Speculator(engine) if spec else None
        self.capabilities = Capabilities.of_engine(engine)
        self._call_grammar_compiles: OrderedDict[str, bool] = OrderedDict()
        self._call_grammar_lock = threading.Lock()  # connections and the worker both ask
        self.totals = ServingTotals()
        self._opened: list[DecodeStream] = []  # this job's streams not yet summed into the totals

    @property
    def slots(self) -> SlotPool | None:
        """The warm slots, or None when every request gets a fresh cache."""
        return self.caches.slots

    # -- connection side -------------------------------------------------------------------
    def release(self) -> None:
        """After a job: the caches it used go back (warm slots keep their rows) and its
        streams' numbers join the totals. The generate methods release on their way out;
        calling it again is harmless."""
        self.count_opened()
        self.caches.release()

    def count_opened(self) -> None:
        """Add the numbers of the streams opened and not yet counted to the totals."""
        for stream in self._opened:
            self.totals.add(stream.stats)
        self._opened.clear()

    def count_ended(self, stream: DecodeStream) -> None:
        """Add an ended stream's numbers to the totals now and let it go: a lockstep batch
        that requests keep joining runs for as long as the load lasts, and its streams must
        not wait for its end (they would pile up, and the totals would stand still)."""
        if stream in self._opened:
            self._opened.remove(stream)
            self.totals.add(stream.stats)

    def constraint_spec(self, request: GenerationRequest) -> ConstraintSpec | None:
        """The request's constraint, a forced call spelled in this family's call convention;
        a request that may call tools and has no constraint of its own gets the call grammar
        (free text until the call marker, then only calls to declared tools)."""
        spec = request.constraint
        if spec is None:
            return self._call_grammar(request)
        return resolve_forced_call(spec, self.family.tools)

    def _call_grammar(self, request: GenerationRequest) -> ConstraintSpec | None:
        """None without tools or a call convention, or when llguidance cannot compile the
        grammar (some declared schema it does not take): the reply then goes unconstrained,
        as a plain tool request always did. The verdict is remembered per tool set, since
        agents send the same declarations with every turn."""
        convention = self.family.tools
        if not request.tools or convention is None:
            return None
        with self._call_grammar_lock:
            tools = [
                tool if self._compiles(tool) else replace(tool, parameters=None) for tool in request.tools
            ]
            spec = ConstraintSpec("lark", auto_call_grammar(tools, convention), "tools")
            compiles = self._remember(spec.source, lambda: self.constraints.validate(spec) is None)
        return spec if compiles else None

    def _compiles(self, tool: ToolSpec) -> bool:
        """Whether llguidance takes the tool's argument schema (else its calls take any object)."""
        if tool.parameters is None:
            return True
        schema = ConstraintSpec.json_schema(bound_number_digits(tool.parameters), "tools")
        return self._remember(schema.source, lambda: self.constraints.validate(schema) is None)

    def _remember(self, source: str, check) -> bool:
        verdicts = self._call_grammar_compiles
        verdict = verdicts.get(source)
        if verdict is None:
            verdict = verdicts[source] = check()
            while len(verdicts) > CALL_GRAMMAR_VERDICTS:
                verdicts.popitem(last=False)
        verdicts.move_to_end(source)
        return verdict

    def tokenize(self, request: GenerationRequest) -> list[int] | Error:
        """The conversation rendered with the chat template and tokenized, whatever its length
        (a raw prompt: as sent, or its fill-in-the-middle prompt)."""
        from inference.engine.chat_template import ChatTemplateError

        if request.raw is not None:
            return raw_prompt_tokens(self.engine, request.raw, self.n_ctx, request.max_tokens)
        try:
            tools = [tool.template_dict() for tool in request.tools] or None
            # A prefill continues the assistant turn the generation prompt opened (rendering it
            # as a message would close that turn and open another).
            return self.engine.encode_chat(
                request.template_messages(),
                tools=tools,
                continuation=request.prefill,
                enable_thinking=self.thinking(request),
            )
        except ChatTemplateError as exc:
            return Error(400, f"the model's chat template rejected the messages: {exc}", param="messages")

    def thinking(self, request: GenerationRequest) -> bool:
        """Whether the prompt turns thinking on: reasoning asked for and, where the prompt
        itself opens the think block (``Family.think_prefilled``), neither a grammar nor a
        client prefill governing the reply from its first token (the template then renders
        thinking off)."""
        if not self.family.think_prefilled:
            return request.reasoning
        return request.reasoning and request.constraint is None and not request.prefill

    def validate(self, request: GenerationRequest) -> PreparedPrompt | Error:
        """Check the constraint, render and tokenize the conversation; reject it if it leaves
        no room to reply."""
        spec = self.constraint_spec(request)
        if spec is not None:
            problem = self.constraints.validate(spec)
            if problem is not None:
                param = request.constraint.param
                return Error(400, f"invalid '{param}': {problem}", code="invalid_value", param=param)
        tokens = self.tokenize(request)
        if isinstance(tokens, Error):
            return tokens
        return budgeted(tokens, self.n_ctx, request.max_tokens, prompt_param(request))

    # -- worker side -----------------------------------------------------------------------
    def open_stream(
        self, request: GenerationRequest, prompt: PreparedPrompt, sink: Sink
    ) -> DecodeStream | None:
        """The request's decoding state in the slot that fits its prompt best (a slot no other
        open stream is writing) behind its KV prefix, prefilled, its first token taken (see
        DecodeStream.begin); None when choosing the prefix failed (the sink has the Error)."""
        chosen = self._choose_prefix(request, prompt, sink)
        if isinstance(chosen, Error):
            sink.close(chosen)
            return None
        choice, prompt = chosen
        stream = DecodeStream(self, request, prompt, sink, self.caches.acquire(prompt, choice))
        self._opened.append(stream)
        router = stream.emitter.router
        if self.family.think_prefilled and self.thinking(request) and router is not None:
            router.feed(self.family.think.open)  # the block the prompt opened
        stream.begin()
        return stream

    def _choose_prefix(
        self, request: GenerationRequest, prompt: PreparedPrompt, sink: Sink
    ) -> tuple[PrefixChoice | None, PreparedPrompt] | Error:
        """The prefix the request runs behind (None without a source) and its prompt with the
        reply budget cut to the room the prefix leaves; an Error when it leaves none."""
        if self.prefix_source is None:
            return None, prompt
        try:
            choice = self.prefix_source.choose(self.engine, request)
        except Exception as exc:  # a broken source fails this request, not the server
            logger.exception("choosing the KV prefix failed")
            message = f"choosing the KV prefix failed: {type(exc).__name__}: {exc}"
            return Error(500, message, code="internal_error")
        sink.prefix_chosen(choice.documents)
        limit = self.n_ctx - choice.prefix.rows  # the context left for real tokens
        room = limit - len(prompt.tokens)
        if room < 1:
            overflow = ContextOverflow(len(prompt.tokens), max(limit, 0))
            message = openai_overflow_message(overflow)
            param = prompt_param(request)
            return Error(400, message, code="context_length_exceeded", param=param, overflow=overflow)
        return choice, PreparedPrompt(prompt.tokens, min(prompt.max_tokens, room))

    def generate(self, request: GenerationRequest, prompt: PreparedPrompt, sink: Sink) -> int:
        """Stream the reply into ``sink`` and close it with Finish (or Error on a failure).
        Returns the number of tokens generated. Stops at the next token once ``sink`` is
        cancelled, then pushes nothing more."""
        try:
            stream = self.open_stream(request, prompt, sink)
            if stream is None:
                return 0
            self.decode(stream)
            return stream.generated
        finally:
            self.release()

    def decode(self, stream: DecodeStream) -> None:
        """Run an opened stream to its end: through the speculator when this backend
        speculates, else one ``decode_one`` per token. Either way the stream samples every row,
        so the reply is the same."""
        if self.speculator is not None:
            self.speculator.drive(stream)
            return
        while stream.live:
            try:
                logits = self.engine.decode_one(stream.cache, stream.token)
            except Exception as exc:
                stream.fail(exc)
                return
            stream.advance(logits)

    def generate_batch(self, items: Sequence[BatchItem], joins: Joins | None = None) -> list[int]:
        """Serve several requests together, one forward per step for all of them (see
        lockstep.py; one pass over the weights where ``capabilities.batch``, the only case the
        worker batches), with ``joins`` letting requests that arrive meanwhile join between
        steps; each reply is the one ``generate`` would give. Tokens generated per stream, in
        the order they were opened (``items`` first)."""
        try:
            return run_lockstep(self, items, joins)
        finally:
            self.release()

    def end_stream(self, stream: DecodeStream) -> None:
        """A stream of a lockstep batch ended before the batch: its numbers join the totals
        and its slot is free for a join."""
        self.count_ended(stream)
        self.caches.finish(stream.cache)

    def warm_up(self) -> None:
        """Run one tiny generation so the first request does not pay for JIT compilation;
        the slot it used is cleared again."""
        request = GenerationRequest(messages=(Message("user", "Hi"),), max_tokens=2)
        prepared = self.validate(request)
        if isinstance(prepared, Error):
            raise RuntimeError(f"warm-up prompt rejected: {prepared.message}")
        if self.speculator is not None:
            self.speculator.measure()  # the verify costs of this machine, for the cost gate
        sink = Recorder()
        stream = DecodeStream(self, request, prepared, sink, self.caches.scratch(prepared.tokens))
        stream.begin()
        self.decode(stream)
        self.caches.discard(stream.cache)
        if isinstance(sink.final, Error):
            raise RuntimeError(f"warm-up generation failed: {sink.final.message}")
