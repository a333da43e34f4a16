"""Fault injection in the suite: a few of bench/faults.py's faults, once each, on small scenarios
(an exploration of matmul 8³ and a `--jobs 2` batch with a conv2d beside it, six trials each).
Each fault strikes once the command has received a few measurements (not at a random moment, so
that it always lands mid-run), then the command runs again to completion, and nothing may be
lost, measured twice, left running or orphaned, and no wrong program reported. The full table,
every fault at random moments, is `python bench/faults.py --repeats 3`.
"""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "faults.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_faults", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


faults = _load_bench()

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="finds a trial's processes in /proc")


def _can_mount() -> bool:
    return os.geteuid() == 0 and subprocess.run(["which", "mount"],
                                                capture_output=True).returncode == 0


def _trial(scenario: str, fault: str, after_received: int, work: Path):
    outcome = faults.run_trial(faults.SMALL[scenario], fault, random.Random(0), work,
                               faults.Moment(after_received=after_received))
    assert not outcome.failed(), str(outcome)
    assert "ended before the fault" not in outcome.notes  # the fault did strike mid-run
    return outcome


@pytest.mark.parametrize("fault", ["kill9", "sigterm", "sigint", "worker-kill9"])
def test_an_exploration_killed_or_interrupted_mid_run_loses_nothing(fault, tmp_path):
    _trial("explore", fault, 3, tmp_path)


@pytest.mark.parametrize("fault", ["kill9", "task-kill9"])
def test_a_batch_whose_driver_or_task_is_killed_loses_nothing(fault, tmp_path):
    # A kill -9 of the driver lost everything its tasks had stored until the next batch merged
    # what they left beside the database.
    _trial("batch", fault, 4, tmp_path)


@pytest.mark.parametrize("fault, kind", [("segfault", "deterministic"), ("alloc", "transient")])
def test_broken_kernels_are_errors_of_their_kind_and_never_the_best(fault, kind, tmp_path):
    outcome = _trial("explore", fault, 0, tmp_path)
    assert "2 broken" in outcome.notes  # both were measured: as errors of `kind` (checked)
    assert faults.EXPECTED[fault][1] == kind


def test_stray_modules_in_the_current_directory_change_nothing(tmp_path):
    _trial("explore", "stray-module", 0, tmp_path)


@pytest.mark.skipif(not _can_mount(), reason="mounting a small tmpfs needs root")
def test_a_batch_on_a_filling_disk_fails_in_one_line_and_resumes_once_there_is_room(tmp_path):
    # A task that could not hand back its rows printed multiprocessing's traceback.
    _trial("batch", "full-disk", 4, tmp_path)
