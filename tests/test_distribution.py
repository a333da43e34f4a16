"""Space experiments: a measured uniform sample of a space."""

import re

import pytest

from eqsched.cli import main
from eqsched.db import Database
from eqsched.tools.distribution import measure_distribution
from eqsched.trials import Settings
from eqsched.workloads import get_workload

SMALL = get_workload("matmul").small_size
FAST = Settings(repeats=2, warmup=0, threads=1)


def test_a_measured_distribution_is_checked_counted_and_stored(tmp_path):
    db = tmp_path / "dist.db"
    dist = measure_distribution("matmul", SMALL, samples=6, seed=1, db=db, settings=FAST)
    assert len(dist.samples) == 6 and dist.correct_fraction == 1.0 and not dist.errors
    assert dist.drawn == 6 + dist.skipped_unrolled + dist.unbuildable
    hist = dist.histogram(bins=5)
    counts = [int(re.search(r"GFLOPS\s+(\d+)", line).group(1)) for line in hist.splitlines()]
    assert len(counts) == 5 and sum(counts) == 6
    pct = dist.percentiles()
    assert pct["p0"] <= pct["p50"] <= pct["p100"] == dist.best.gflops
    with Database(db, readonly=True) as stored:
        assert len(stored.records("matmul", SMALL)) == dist.measured
    again = measure_distribution("matmul", SMALL, samples=6, seed=1, db=db, settings=FAST)
    assert again.measured == 0
    assert again.gflops == dist.gflops


@pytest.mark.parametrize("argv, message", [
    (["distribution", "matmul", "--samples", "0"], "--samples must be >= 1"),
])
def test_cli_errors_are_one_line(argv, message, capsys):
    assert main(["experiment", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eqsched: error: ") and message in err and "\n" not in err


def test_a_plot_that_could_not_be_written_is_refused_before_measuring(tmp_path, capsys):
    assert main(["experiment", "distribution", "matmul", "--size", "8,8,8", "--samples", "2",
                 "--plot", str(tmp_path / "no dir" / "h.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"eqsched: error: cannot write the plot to {tmp_path / 'no dir'}")
    assert "drawing" not in err  # nothing was measured
