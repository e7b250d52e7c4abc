"""``tributary cluster reassign`` argument parsing: rates."""

import pytest

from gateway.cli.reassign import parse_rate


@pytest.mark.parametrize(
    ("text", "rate"),
    [("1048576", 1_048_576), ("500k", 500_000), ("10MB", 10_000_000), ("1g", 10**9), ("2.5M/s", 2_500_000)],
)
def test_rates(text, rate):
    assert parse_rate(text) == rate


@pytest.mark.parametrize("text", ["", "fast", "10 TB", "MB", "-5"])
def test_bad_rates(text):
    with pytest.raises(ValueError):
        parse_rate(text)
