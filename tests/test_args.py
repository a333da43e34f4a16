"""What the command line's argument parsers accept and how they refuse the rest."""

import argparse
import math

import pytest

from eqsched.args import max_memory_bytes, timeout_arg
from eqsched.runner import MIN_MAX_MEMORY, machine_memory


@pytest.mark.parametrize("text, expected", [
    ("8G", 8 << 30), ("8GiB", 8 << 30), ("8gb", 8 << 30), ("512M", 512 << 20),
    ("1.5G", 3 << 29), ("300000000", 300_000_000), (" 1T ", 1 << 40), (1 << 30, 1 << 30),
])
def test_a_memory_cap_is_a_size_in_binary_units_or_bytes(text, expected):
    assert max_memory_bytes(text) == expected


def test_a_memory_cap_can_be_a_share_of_this_machine():
    assert max_memory_bytes("50%") == machine_memory() // 2


@pytest.mark.parametrize("text, message", [
    ("lots", "a size like 8G"), ("8X", "a size like 8G"), ("-1G", "a size like 8G"),
    ("0", "at least 256 MiB"), ("1K", "at least 256 MiB"), ("200%", "from 0 to 100"),
    ("0%", "from 0 to 100"), (True, "a size like 8G"),
])
def test_a_bad_memory_cap_is_refused_with_what_was_given(text, message):
    with pytest.raises(ValueError, match=message):
        max_memory_bytes(text)
    assert MIN_MAX_MEMORY == 256 << 20


def test_a_timeout_is_a_positive_finite_number_of_seconds():
    assert timeout_arg("2.5") == 2.5
    for bad in ("inf", "nan", "0", "-1", "1e300", "abc"):
        with pytest.raises(argparse.ArgumentTypeError, match="timeout must be"):
            timeout_arg(bad)
    assert math.isfinite(timeout_arg("86400"))
