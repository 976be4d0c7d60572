"""Turns generated token bytes into reply text that is safe to send as it comes.

Two things make a token's bytes unsafe to forward at once: a token may end in the middle of a
UTF-8 code point (the rest arrives with the next token), and the text may be the beginning
of a stop string (which must never reach the client). The emitter holds back exactly those
bytes and releases them as soon as they are known to be plain text.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextEmitter:
    """Incremental UTF-8 decoding plus the stop-string scan of one reply."""

    def __init__(self, stop: Sequence[str] = ()):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = tuple(s for s in stop if s)
        self._held = ""  # decoded text that may still turn out to start a stop string
        self.stopped_by: str | None = None  # the stop string that ended the reply

    @property
    def stopped(self) -> bool:
        return self.stopped_by is not None

    def feed(self, data: bytes) -> str:
        """Add one token's bytes; return the text that can be sent now. After a stop string
        is found, returns the text before it and ignores everything later."""
        if self.stopped:
            return ""
        text = self._held + self._decoder.decode(data)
        cut, stop = self._earliest_stop(text)
        if stop is not None:
            self.stopped_by = stop
            self._held = ""
            return text[:cut]
        keep = self._stop_prefix_length(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The reply ended without a stop string: release everything held back (an incomplete
        code point at the very end becomes U+FFFD)."""
        if self.stopped:
            return ""
        text = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return text

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
