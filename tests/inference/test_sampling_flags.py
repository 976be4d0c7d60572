"""``manage.py lmserve --temp/--top-k/.../--seed``: the server-wide sampling defaults, checked
like a request's fields, filling only what a request leaves out."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from inference.management.options import SAMPLING_FLAGS
from inference.types import SamplingOverrides


@pytest.mark.parametrize(
    "flag, value, expected",
    [
        ("--temp", "2.5", "expected from 0.0 to 2.0, got '2.5'"),
        ("--temp", "warm", "expected a number, got 'warm'"),
        ("--top-k", "-1", "expected from 0, got '-1'"),
        ("--top-k", "1.5", "expected an integer, got '1.5'"),
        ("--repeat-penalty", "0", "expected above 0.0 to 10.0, got '0'"),
        ("--min-p", "nan", "expected from 0.0 to 1.0, got 'nan'"),
        ("--seed", "x", "expected an integer, got 'x'"),
    ],
)
def test_a_value_out_of_its_range_is_refused_naming_the_flag(flag, value, expected):
    with pytest.raises(CommandError) as refused:
        call_command("lmserve", flag, value)
    assert f"argument {flag}: {expected}" in str(refused.value)


def test_every_sampling_field_has_a_flag():
    assert {option.field for option in SAMPLING_FLAGS} == set(SamplingOverrides.__dataclass_fields__)


def test_a_request_field_wins_over_the_server_default():
    server = SamplingOverrides(temperature=0.0, seed=7, top_k=5)
    request = SamplingOverrides(temperature=0.9, top_p=0.5)
    assert request.over(server) == SamplingOverrides(temperature=0.9, top_p=0.5, top_k=5, seed=7)
    assert SamplingOverrides().over(server) == server
    assert SamplingOverrides().is_empty and not server.is_empty
