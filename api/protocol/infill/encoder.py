"""llama.cpp's /infill answer: the completion object of its /completion endpoint, kept to
what editors read (llama.vscode: ``content``, ``tokens_cached``, ``truncated``, ``timings``),
and its stream of ``data:`` chunks (``content`` pieces with ``stop: false``, then a last chunk
with ``stop: true`` and the numbers; no ``[DONE]``)."""

from __future__ import annotations

from dataclasses import dataclass

from inference.types import Finish


@dataclass(frozen=True)
class Timings:
    """Where the reply's time went, as the connection saw it (milliseconds): from queueing to
    the first token (queue wait and prefill), and from the first token to the last."""

    prompt_ms: float
    predicted_ms: float


def _per_second(tokens: int, ms: float) -> float:
    return tokens / ms * 1000.0 if ms > 0 else 0.0


class InfillEncoder:
    """Builds the /infill completion object and its stream chunks."""

    def __init__(self, model_id: str):
        self.model = model_id

    def chunk(self, text: str) -> dict:
        """A piece of the middle, streamed."""
        return {"index": 0, "content": text, "tokens": [], "stop": False, "id_slot": 0}

    def final(self, content: str, finish: Finish, timings: Timings) -> dict:
        """The whole answer (``content`` is everything streamed so far, or "" in a stream's
        last chunk), with the stop reason and the token numbers."""
        usage = finish.usage
        word = finish.stop_sequence
        stop_type = "word" if word is not None else ("limit" if finish.reason == "length" else "eos")
        prompt_n = usage.prompt_tokens - usage.cached_tokens
        return {
            "index": 0,
            "content": content,
            "tokens": [],
            "id_slot": 0,
            "stop": True,
            "model": self.model,
            "tokens_predicted": usage.completion_tokens,
            "tokens_evaluated": usage.prompt_tokens,
            "tokens_cached": usage.cached_tokens,
            "truncated": False,
            "stop_type": stop_type,
            "stopping_word": word or "",
            "stopped_eos": stop_type == "eos",
            "stopped_word": stop_type == "word",
            "stopped_limit": stop_type == "limit",
            "timings": {
                "prompt_n": prompt_n,
                "prompt_ms": timings.prompt_ms,
                "prompt_per_second": _per_second(prompt_n, timings.prompt_ms),
                "predicted_n": usage.completion_tokens,
                "predicted_ms": timings.predicted_ms,
                "predicted_per_second": _per_second(usage.completion_tokens, timings.predicted_ms),
            },
        }
