"""A GGUF header's string arrays decoded at once (gguf_strings.py): the same strings and end
position as the one-at-a-time reference, on every kind of string the header holds."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from inference.engine.gguf_strings import read_strings, string_starts, strings_one_by_one


def _encoded(strings: list[bytes], lead: bytes = b"\x07" * 5) -> np.ndarray:
    """``strings`` as a header writes them (a uint64 count, the bytes), after some other bytes."""
    body = b"".join(struct.pack("<Q", len(s)) + s for s in strings)
    return np.frombuffer(lead + body + b"tail", np.uint8)


CASES = {
    "ascii and empty": [b"hello", b"", b"world", b""],
    "unicode": ["Ġthe".encode(), "▁über".encode(), "日本".encode(), "🙂".encode()],
    "invalid utf-8": [b"\xe2\x82", b"\xff", b"ok", b"\xc3"],  # cut sequences, a lone byte
    "a NUL inside": [b"a", b"b\x00c", b"d"],  # the joined buffer cannot split these
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_pass_reads_what_the_reference_reads(case):
    strings = CASES[case]
    buf = _encoded(strings)
    expected, end = strings_one_by_one(memoryview(buf), 5, len(strings))
    assert expected == [s.decode("utf-8", "replace") for s in strings]
    assert end == len(buf) - 4
    assert read_strings(buf, 5, len(strings)) == (expected, end)


def test_zero_strings_and_the_starts():
    buf = _encoded([b"ab", b"c"])
    assert read_strings(buf, 5, 0) == ([], 5)
    assert string_starts(memoryview(buf), 5, 2) == ([5, 15], len(buf) - 4)


@pytest.mark.parametrize("cut", [1, 4, 8, 10])
def test_a_buffer_that_ends_inside_the_strings_is_refused(cut):
    buf = _encoded([b"abcdef", b"xyz"], lead=b"")[: 8 + 6 + cut]  # inside the second string
    assert read_strings(buf, 0, 2) is None
    assert len(strings_one_by_one(memoryview(buf), 0, 2)[0]) == 1


def test_corrupt_counts_are_refused_without_reading_past_the_buffer():
    huge = np.frombuffer(struct.pack("<Q", 2**64 - 1) + b"abc", np.uint8)
    assert read_strings(huge, 0, 1) is None
    long = np.frombuffer(struct.pack("<Q", 1000) + b"abc", np.uint8)
    assert read_strings(long, 0, 1) is None
    assert read_strings(long, 0, 2**60) is None  # an array count no file could hold
