"""What the command line's argument parsers accept and how they refuse the rest."""

import argparse
import math
import subprocess
import sys

import pytest
from test_cli import ENV

from eqsched.args import (
    CliError,
    check_writable,
    max_memory_bytes,
    parse_limits,
    parse_rules,
    seconds_arg,
    seed_arg,
    timeout_arg,
)
from eqsched.egraph.saturate import Limits
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
    ("99999999999999T", "at most 1 EiB"),  # setrlimit overflowed, in the worker
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


def test_a_time_budget_is_a_positive_finite_number_of_seconds():
    assert seconds_arg("30") == 30.0
    for bad in ("inf", "nan", "0", "-1", "abc"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"seconds must be .*got '{bad}'"):
            seconds_arg(bad)


def test_a_bad_time_is_quoted_as_it_was_typed():
    """1e400 reads as inf; the message names what the user wrote."""
    for arg in (timeout_arg, seconds_arg):
        with pytest.raises(argparse.ArgumentTypeError, match="got '1e400'$"):
            arg("1e400")


def test_a_seed_is_an_integer_from_0_that_fits_the_database():
    assert seed_arg("0") == 0 and seed_arg(str(2**63 - 1)) == 2**63 - 1
    for bad, message in (("-1", "from 0 to 2\\*\\*63 - 1, got -1"), (str(2**63), "from 0"),
                         ("1.5", "an integer, got '1.5'"), ("abc", "an integer, got 'abc'")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            seed_arg(bad)


def test_limits_are_checked_before_saturating():
    assert parse_limits("iterations=3,seconds=0") == Limits(iterations=3, seconds=0.0)
    for text, message in (("iterations=0", "iterations must be an integer >= 1"),
                          ("enodes=-5", "enodes must be an integer >= 1"),
                          ("seconds=nan", "seconds must be a finite number >= 0"),
                          ("seconds=inf", "seconds must be a finite number >= 0"),
                          ("seconds=-1", "seconds must be a finite number >= 0"),
                          ("iterations=3,iterations=4", "iterations is given twice")):
        with pytest.raises(CliError, match=f"bad --limits '{text}': {message}"):
            parse_limits(text)


def test_a_rules_spec_that_names_nothing_is_not_the_default_set():
    assert parse_rules(None) is None
    assert parse_rules(" -pack, +unroll ") == ["-pack", "+unroll"]
    for empty in (",", " , ,", ""):
        with pytest.raises(CliError, match="names no rule"):
            parse_rules(empty)


def test_an_output_file_is_checked_by_writing_beside_it(tmp_path):
    kept = tmp_path / "best.json"
    kept.write_text("old")
    check_writable(kept, "the trace")
    check_writable(tmp_path / "new.json", "the trace")
    assert kept.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == [
        "best.json"]  # nothing created, nothing changed, no probe left
    for path, message in ((tmp_path / "no dir" / "t.json", "No such file or directory"),
                          (tmp_path, "it is a directory"), ("", "no file name given")):
        with pytest.raises(CliError, match=message):
            check_writable(path, "the trace")


def test_an_output_file_on_a_full_disk_is_refused(tmp_path):
    """A file size limit of 0 stands in for a full disk: creating the file works, writing it
    does not (EFBIG, as ENOSPC would)."""
    script = ("import resource, signal, sys\n"
              "from eqsched.args import CliError, check_writable\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))\n"
              "try:\n"
              "    check_writable(sys.argv[1], 'the trace')\n"
              "except CliError as e:\n"
              "    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "t.json")],
                          capture_output=True, text=True, env=ENV, timeout=60)
    assert proc.stdout.startswith(f"cannot write the trace to {tmp_path / 't.json'} (File too "
                                  f"large)"), proc.stderr
    assert list(tmp_path.iterdir()) == []
