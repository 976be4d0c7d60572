"""Generation in token ids on a cache the caller holds: for the ``generate`` command,
benchmarks and tests, which think in prompts of token ids and fixed sampling parameters.

A run is a raw request served by the server's own path: a :class:`DecodeStream` driven by
:meth:`ConversationBackend.decode` (plain, or through the speculator). There is one decode
loop, so a token here is the token a server request would get.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from inference.engine.engine import Engine
from inference.engine.kv_cache import KVCache
from inference.engine.sampler import SamplingParams
from inference.generation.backend import ConversationBackend
from inference.generation.constraints import ConstraintSpec
from inference.generation.speculative import Speculator
from inference.generation.stream import DecodeStream, GenerationStats, Recorder
from inference.kv.prefix_source import PrefixChoice
from inference.kv.slots import SlotPool
from inference.types import Error, Event, Finish, GenerationRequest, PreparedPrompt, RawPrompt


@dataclass
class TokenRun:
    """What one run generated: the token ids (an end-of-generation token is not one of them),
    the stream's numbers, its events, and how it ended (None when the caller stopped it)."""

    tokens: list[int]
    stats: GenerationStats
    events: list[Event]
    final: Finish | Error | None


class HeldCache:
    """A cache policy over the cache the caller passes to each run (with any prefix it
    installed): nothing is kept between runs but what the caller keeps."""

    slots: SlotPool | None = None

    def __init__(self):
        self.cache: KVCache | None = None

    def held(self) -> KVCache:
        assert self.cache is not None, "a run names its cache first"
        return self.cache

    def acquire(self, prompt: PreparedPrompt, choice: PrefixChoice | None) -> KVCache:
        return self.held()

    def release(self) -> None:
        pass

    def finish(self, cache: KVCache) -> None:
        pass

    def scratch(self, tokens: list[int]) -> KVCache:
        return self.held()

    def discard(self, cache: KVCache) -> None:
        cache.truncate(0)  # a failed run's rows are undefined; a prefix stays


class TokenGenerator:
    """Runs prompts of token ids on the caller's caches through the server's decode loop;
    with a ``speculator``, speculatively (the same tokens, fewer forwards)."""

    def __init__(self, engine: Engine, speculator: Speculator | None = None):
        self.engine = engine
        self._caches = HeldCache()
        self.backend = ConversationBackend(engine, n_ctx=0, caches=self._caches)
        self.backend.speculator = speculator

    def run(
        self,
        cache: KVCache,
        prompt: Sequence[int],
        params: SamplingParams,
        max_tokens: int,
        *,
        ignore_eos: bool = False,
        constraint: ConstraintSpec | None = None,
        on_text: Callable[[str], None] | None = None,
        stop_after: int | None = None,
    ) -> TokenRun:
        """Generate after ``prompt`` in ``cache`` (its common prefix with the prompt is
        reused) until an end-of-generation token, ``max_tokens``, a full context, the
        completion of ``constraint``, or ``stop_after`` tokens (the caller stops reading, as a
        client that hangs up). ``on_text`` sees the reply text as it streams."""
        tokens = list(prompt)
        request = GenerationRequest(
            messages=(),
            max_tokens=max_tokens,
            ignore_eos=ignore_eos,
            constraint=constraint,
            raw=RawPrompt(tokens=tuple(tokens)),
        )
        self.backend.defaults = params  # the request overrides nothing
        self._caches.cache = cache
        stream: DecodeStream | None = None

        def stop() -> bool:
            return stop_after is not None and stream is not None and stream.generated >= stop_after

        sink = Recorder(on_text, stop)
        stream = DecodeStream(self.backend, request, PreparedPrompt(tokens, max_tokens), sink, cache)
        stream.begin()
        self.backend.decode(stream)
        return TokenRun(stream.history[len(tokens) :], stream.stats, sink.events, sink.final)
