"""A GGUF header's string arrays (a vocabulary, its merges), decoded in one call.

A string in the header is a little-endian uint64 byte count and that many UTF-8 bytes. A
vocabulary and its merges are ~300k of them (Qwen2.5's 152k tokens and 151k merges), and a
loop that slices, decodes and appends each one took 0.3-0.4 s of a 1.2 s model load. Here the
loop only follows the counts; numpy then puts a NUL where each count was and drops the count's
other bytes, and Python decodes the joined bytes once and splits them at the NULs. A string
that holds a NUL byte itself would split in two, so then the strings are read one at a time
(``strings_one_by_one``, also the reference the fast path is tested against).

Decoding the joined bytes with ``errors="replace"`` gives each string what decoding it alone
gives: a NUL is a complete one-byte character, so no invalid sequence spans two strings.
"""

from __future__ import annotations

import struct

import numpy as np

COUNT_BYTES = 8
_U64 = struct.Struct("<Q")


def string_starts(raw: memoryview, pos: int, count: int) -> tuple[list[int], int] | None:
    """Where each of ``count`` strings from ``pos`` starts (its count's first byte), and the
    position after the last; None when the buffer ends inside them."""
    end, length = len(raw), _U64.unpack_from
    if count > (end - pos) // COUNT_BYTES:  # a corrupt count: not even room for the counts
        return None
    starts = [0] * count
    for k in range(count):
        if pos + COUNT_BYTES > end:
            return None
        starts[k] = pos
        pos += COUNT_BYTES + length(raw, pos)[0]
    return (starts, pos) if pos <= end else None


def strings_one_by_one(raw: memoryview, pos: int, count: int) -> tuple[list[str], int]:
    """The same strings decoded one at a time -> (the strings, the position after the last);
    fewer than ``count`` strings when the buffer ends inside them."""
    end, length, out = len(raw), _U64.unpack_from, []
    for _ in range(count):
        if pos + COUNT_BYTES > end:
            break
        (n,) = length(raw, pos)
        if pos + COUNT_BYTES + n > end:
            break
        out.append(str(raw[pos + COUNT_BYTES : pos + COUNT_BYTES + n], "utf-8", "replace"))
        pos += COUNT_BYTES + n
    return out, pos


def read_strings(buf: np.ndarray, pos: int, count: int) -> tuple[list[str], int] | None:
    """``count`` strings from byte ``pos`` of ``buf`` (uint8) -> (the strings, the position after
    the last), or None when the buffer ends inside them."""
    found = string_starts(memoryview(buf), pos, count)
    if found is None:
        return None
    starts, after = found
    heads = np.asarray(starts, np.int64) - pos  # (count,) each count's first byte
    span = buf[pos:after].copy()  # (after - pos,) uint8
    keep = np.ones(span.size, bool)
    keep[(heads[:, None] + np.arange(COUNT_BYTES - 1)).ravel()] = False  # all but a count's last byte
    span[heads + COUNT_BYTES - 1] = 0  # which becomes the NUL before its string
    parts = span[keep].tobytes().decode("utf-8", "replace").split("\x00")  # ["", s0, s1, ...]
    if len(parts) != count + 1:  # a string holds a NUL of its own
        return strings_one_by_one(memoryview(buf), pos, count)
    return parts[1:], after
