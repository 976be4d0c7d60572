"""Turns generated token bytes into reply text that is safe to send as it comes.

Two things make a token's bytes unsafe to forward at once: a token may end in the middle of a
UTF-8 code point (the rest arrives with the next token), and the text may be the beginning
of a stop string (which must never reach the client). The emitter holds back exactly those
bytes and releases them as soon as they are known to be plain text.

:class:`ReplyEmitter` runs a whole reply through the stages in the order its text is
understood: decoding, the think head (:class:`ThinkRouter`), function calls
(:class:`~inference.generation.toolcall.ToolCallScanner`), and last the stop strings, which act on the
reply text alone.

Log probabilities follow the text they belong to. Each token fed with its
:class:`~inference.types.TokenLogprob` covers a span of the decoded text (a token ending inside
a code point covers that code point too); every TextDelta is a contiguous span of the decoded
text, and carries the tokens whose first reply character it holds. Tokens whose text never
reaches the reply (a think block, a captured call, a stop string and what followed it) are not
reported; a token held back with its text (a possible stop-string start, an incomplete code
point) is reported when that text is sent.
"""

from __future__ import annotations

import codecs
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

from inference.engine.families import ThinkTags, ToolConvention
from inference.generation.toolcall import ToolCall, ToolCallScanner
from inference.types import ReasoningDelta, TextDelta, TokenLogprob, ToolCallDelta


class StopScanner:
    """The stop-string scan over decoded reply text: holds back a possible stop-string start
    and cuts the text at the first stop string."""

    def __init__(self, stop: Sequence[str] = ()):
        self._stops = tuple(s for s in stop if s)
        self._held = ""  # text that may still turn out to start a stop string
        self.stopped_by: str | None = None  # the stop string that ended the reply

    @property
    def stopped(self) -> bool:
        return self.stopped_by is not None

    @property
    def held(self) -> int:
        """Characters held back as a possible stop-string start."""
        return len(self._held)

    def feed_text(self, text: str) -> str:
        """Add more text; return the text that can be sent now. After a stop string is found,
        returns the text before it and ignores everything later."""
        if self.stopped:
            return ""
        text = self._held + text
        cut, stop = self._earliest_stop(text)
        if stop is not None:
            self.stopped_by = stop
            self._held = ""
            return text[:cut]
        keep = self._stop_prefix_length(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The text held back as a possible stop-string start, released as plain text (the
        reply ended, or something that is not text, such as a function call, came next)."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _earliest_stop(self, text: str) -> tuple[int, str | None]:
        best, found = len(text), None
        for stop in self._stops:
            at = text.find(stop)
            if 0 <= at < best:
                best, found = at, stop
        return best, found

    def _stop_prefix_length(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest


class TextEmitter(StopScanner):
    """Incremental UTF-8 decoding plus the stop-string scan of one plain reply."""

    def __init__(self, stop: Sequence[str] = ()):
        super().__init__(stop)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        """Add one token's bytes; return the text that can be sent now (see ``feed_text``)."""
        return self.feed_text(self._decoder.decode(data))

    def flush(self) -> str:
        """The reply ended without a stop string: release everything held back (an incomplete
        code point at the very end becomes U+FFFD)."""
        if self.stopped:
            return ""
        return self.feed_text(self._decoder.decode(b"", final=True)) + super().flush()


class ThinkRouter:
    """Splits a reply's decoded text into a leading think block (reasoning, between the
    family's ``tags``) and the reply.

    Works on text, not token ids, so markers split over several tokens route the same. Only
    a block at the very start counts (leading whitespace aside); a stray leading closing tag
    (the template opened the block itself) is dropped, with what came before it treated as
    reasoning only if an opening marker was seen."""

    def __init__(self, tags: ThinkTags):
        self.open, self.close = tags.open, tags.close
        self._state = "start"  # start -> thinking -> gap (whitespace after the block) -> reply
        self._held = ""

    @property
    def in_block(self) -> bool:
        """Whether the text fed so far ends inside the think block."""
        return self._state == "thinking"

    @property
    def thinking(self) -> bool:
        """Whether text fed now may still be reasoning."""
        return self._state in ("start", "thinking")

    def feed(self, text: str) -> tuple[str, str]:
        """Route more text; returns ``(reasoning, reply)`` that can be sent now."""
        text = self._held + text
        self._held = ""
        if self._state == "start":
            return self._feed_start(text)
        if self._state == "thinking":
            return self._feed_thinking(text)
        if self._state == "gap":
            return "", self._feed_gap(text)
        return "", text

    def flush(self) -> tuple[str, str]:
        """The reply ended: release held text (an unclosed think block stays reasoning)."""
        held, self._held = self._held, ""
        if self._state == "thinking":
            return held, ""
        return "", held

    def _feed_start(self, text: str) -> tuple[str, str]:
        body = text.lstrip()
        for marker in (self.open, self.close):
            if marker.startswith(body) and len(body) < len(marker):
                self._held = text  # could still become a marker
                return "", ""
        if body.startswith(self.open):
            self._state = "thinking"
            return self._feed_thinking(body[len(self.open) :])
        if body.startswith(self.close):
            self._state = "gap"
            return "", self._feed_gap(body[len(self.close) :])
        self._state = "reply"
        return "", text

    def _feed_gap(self, text: str) -> str:
        reply = text.lstrip()
        if reply:
            self._state = "reply"
        return reply

    def _feed_thinking(self, text: str) -> tuple[str, str]:
        close = self.close
        at = text.find(close)
        if at >= 0:
            self._state = "gap"
            return text[:at], self._feed_gap(text[at + len(close) :])
        keep = next((n for n in range(len(close) - 1, 0, -1) if text.endswith(close[:n])), 0)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], ""


class _PendingToken(NamedTuple):
    """A fed token's log probability and the decoded characters ``[start, end)`` it covers."""

    record: TokenLogprob
    start: int
    end: int


class ReplyEmitter:
    """A reply's token bytes as events, in the order the reply's text is understood: UTF-8
    decoding, then (when the family writes think blocks) the leading think block split off, to
    reasoning when the channel is on and dropped otherwise, then (when tools were declared)
    function calls captured, and last the stop-string scan over the reply text that remains.
    A stop string inside the think block or inside a call's JSON therefore never ends the reply."""

    def __init__(
        self,
        stop: Sequence[str] = (),
        reasoning: bool = False,
        tools: ToolConvention | None = None,
        think: ThinkTags | None = None,
        tool_names: frozenset[str] | None = None,
    ):
        """``think``: split off a leading think block between these tags (the family writes
        them); ``reasoning``: send that block as ReasoningDelta events, else it is dropped;
        ``tools``: capture function calls written in this convention; ``tool_names``: the
        declared tools, the only names a call written without the markers may take."""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = StopScanner(stop)
        self.router = ThinkRouter(think) if think is not None else None
        self.reasoning = reasoning  # route the think block to reasoning (else it is dropped)
        self.scanner = ToolCallScanner(tools, tool_names) if tools is not None else None
        self.reasoning_tokens = 0  # tokens fed while inside the think block
        self.calls = 0  # function calls emitted
        self._decoded = 0  # characters decoded so far: the coordinates of the spans below
        self._stop_input_end = 0  # where the text fed to the stop scan so far ends
        self._pending: deque[_PendingToken] = deque()  # fed tokens not yet reported or dropped

    @property
    def stopped(self) -> bool:
        return self.text.stopped

    @property
    def in_think_head(self) -> bool:
        """Whether text fed now may still open, fill or close the think block."""
        return self.router is not None and self.router.thinking

    @property
    def stopped_by(self) -> str | None:
        return self.text.stopped_by

    def feed(self, data: bytes, logprob: TokenLogprob | None = None) -> list:
        """Events for one more token's bytes (none once a stop string ended the reply);
        ``logprob``: the token's log probability, reported with the text it belongs to."""
        if self.stopped:
            return []
        was_in_block = self.router is not None and self.router.in_block
        start = self._decoded
        text = self._decoder.decode(data)
        self._decoded += len(text)
        if logprob is not None:
            # Bytes of a code point still incomplete belong to the character they will make.
            incomplete = 1 if self._decoder.getstate()[0] else 0
            self._pending.append(_PendingToken(logprob, start, max(self._decoded + incomplete, start + 1)))
        events = self._route(text, final=False)
        if was_in_block or (self.router is not None and self.router.in_block):
            self.reasoning_tokens += 1
        return events

    def flush(self) -> list:
        """Events for everything held back once the reply ended."""
        if self.stopped:
            return []
        text = self._decoder.decode(b"", final=True)
        self._decoded += len(text)
        return self._route(text, final=True)

    def _route(self, text: str, final: bool) -> list:
        reasoning, reply = "", text
        if self.router is not None:
            reasoning, reply = self.router.feed(text)
            if final:
                more_reasoning, more_reply = self.router.flush()
                reasoning, reply = reasoning + more_reasoning, reply + more_reply
        events = [ReasoningDelta(reasoning)] if reasoning and self.reasoning else []
        return events + self._reply_events(reply, final)

    def _reply_events(self, reply: str, final: bool) -> list:
        # The reply text is always the decoded text's tail (the think router holds nothing
        # once the reply has begun), so it ends where the decoded text does.
        if self.scanner is None:
            items: list = [(reply, self._decoded)] if reply else []
        else:
            spans = self.scanner.feed_spans(reply) + (self.scanner.flush_spans() if final else [])
            shift = self._decoded - self.scanner.fed  # scanner coordinates -> decoded ones
            items = [(item, end + shift) for item, end in spans]
        events = []
        for item, end in items:
            if isinstance(item, ToolCall):
                # A call is a boundary: text held as a possible stop-string start is plain text.
                self._text_event(events, self.text.flush(), self._stop_input_end)
                events.append(ToolCallDelta(item, self.calls))
                self.calls += 1
            else:
                unsent = self.text.held + len(item)
                sent = self.text.feed_text(item)
                self._stop_input_end = end
                # What was sent is the start of (held + item); the rest is held or cut.
                self._text_event(events, sent, end - (unsent - len(sent)))
            if self.stopped:
                return events
        if final:
            self._text_event(events, self.text.flush(), self._stop_input_end)
        return events

    def _text_event(self, events: list, text: str, end: int) -> None:
        """A TextDelta of ``text``, the decoded characters ``[end - len(text), end)``, with
        the tokens whose first reply character is among them."""
        if text:
            events.append(TextDelta(text, self._claim(end - len(text), end)))

    def _claim(self, start: int, end: int) -> tuple[TokenLogprob, ...]:
        """Take the pending tokens that begin before ``end``: those reaching into ``[start,
        end)`` are reported; those wholly before it carried no reply text (dropped)."""
        pending, claimed = self._pending, []
        while pending and pending[0].start < end:
            token = pending.popleft()
            if token.end > start:
                claimed.append(token.record)
        return tuple(claimed)
