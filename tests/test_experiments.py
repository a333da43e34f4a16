"""Space experiments: comparing rule sets' spaces, a measured uniform sample, cost-model ranking."""

import json
import re

import numpy as np
import pytest
from eqsched.extract.cost import CostModel
from eqsched.rules import resolve

from eqsched.cli import main
from eqsched.db import Database
from eqsched.egraph.derive import realize
from eqsched.egraph.space import build_space
from eqsched.explore import Settings
from eqsched.ir import naive_program
from eqsched.tools.experiments import compare_spaces, measure_distribution, rank_quality, wilson
from eqsched.workloads import get_workload

SMALL = get_workload("matmul").small_size
FAST = Settings(repeats=2, warmup=0, threads=1)


def test_wilson_interval_stays_inside_0_1_and_contains_the_estimate():
    assert wilson(0, 0) == (0.0, 1.0)
    low, high = wilson(200, 200)
    assert 0.98 < low < 1.0 and high == 1.0
    low, high = wilson(29, 200)
    assert low < 29 / 200 < high


def test_a_rule_set_against_itself_overlaps_fully_both_ways():
    cmp = compare_spaces("matmul", SMALL, None, None, samples=30)
    assert cmp.a.programs == cmp.b.programs
    assert cmp.a_in_b.fraction == cmp.b_in_a.fraction == 1.0
    assert any("consistent with A ⊆ B" in s for s in cmp.statements)


def test_without_a_rule_is_a_subset_of_the_default_set():
    cmp = compare_spaces("matmul", SMALL, "-pack", None, samples=40)
    assert cmp.a.programs < cmp.b.programs
    assert cmp.a_in_b.fraction == 1.0  # every program without pack is in the default space
    assert cmp.b_in_a.fraction < 1.0  # packed programs are not in A
    assert cmp.a_in_b.low < 1.0 == cmp.a_in_b.high  # a sample, so an interval
    assert "B ⊄ A exactly" in " ".join(cmp.statements)  # B is the larger: exact, not sampled
    # |A∩B| = |A| here: the estimate from A's side is exact at fraction 1.
    assert cmp.a_in_b.intersection == cmp.a.programs


def test_spaces_no_larger_than_the_sample_are_tested_whole():
    cmp = compare_spaces("matmul", SMALL, "reorder", "vectorize", samples=50)
    assert cmp.a_in_b.exact and cmp.b_in_a.exact
    assert cmp.b.programs == 1 and cmp.b_in_a.tested == 1 and cmp.b_in_a.fraction == 1.0
    assert cmp.a_in_b.low == cmp.a_in_b.fraction == cmp.a_in_b.high
    assert "B ⊆ A exactly" in " ".join(cmp.statements)


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


class _Oracle(CostModel):
    """Predicts the true times (or their reverse): a perfect and a perfectly wrong model."""

    name = "oracle"

    def __init__(self, times: dict[str, float], reverse: bool = False):
        self.times, self.reverse = times, reverse

    def predict(self, programs):
        t = np.array([self.times[p.hash()] for p in programs])
        return 1 / t if self.reverse else t


class _Memorizer(CostModel):
    """Knows exactly the programs it was trained on, nothing else: perfect if tested on them."""

    name = "memorizer"

    def __init__(self):
        self.seen: dict[str, float] = {}

    def update(self, programs, seconds):
        self.seen.update((p.hash(), s) for p, s in zip(programs, seconds))

    def predict(self, programs):
        return np.array([self.seen.get(p.hash(), 1.0) for p in programs])


@pytest.fixture(scope="module")
def timed_programs():
    """20 distinct programs of the space with made-up times (nothing is measured)."""
    naive = naive_program(get_workload("matmul").build(*SMALL))
    space = build_space(naive, resolve("-unroll"))
    programs = {}
    for term, sizes in space.sample(40, seed=3):
        prog = realize(term, sizes, naive)
        programs.setdefault(prog.hash(), prog)
    return [(p, 0.001 * (i + 1)) for i, p in enumerate(list(programs.values())[:20])]


def test_a_model_predicting_the_truth_ranks_perfectly_and_its_reverse_worst(timed_programs):
    times = {p.hash(): t for p, t in timed_programs}
    q = rank_quality(timed_programs, [_Oracle(times), "random"])
    perfect = q["oracle"]
    assert perfect["spearman"] == pytest.approx(1.0) and perfect["kendall"] == pytest.approx(1.0)
    assert perfect["top_recall"] == 1.0 and perfect["top1_fraction"] == 1.0
    assert perfect["n"] == 20 and perfect["top_k"] == 2
    worst = rank_quality(timed_programs, [_Oracle(times, reverse=True)])["oracle"]
    assert worst["spearman"] == pytest.approx(-1.0) and worst["top_recall"] == 0.0
    assert worst["top1_fraction"] == pytest.approx(1 / 20)
    assert -1 <= q["random"]["spearman"] <= 1


def test_learning_models_never_predict_what_they_were_trained_on(timed_programs):
    # Held out fold by fold, a memorizer knows none of the programs it predicts: all ties.
    q = rank_quality(timed_programs, [_Memorizer()], folds=4)["memorizer"]
    assert q["spearman"] is None and q["folds"] == 4


def test_ranking_needs_three_programs(timed_programs):
    with pytest.raises(ValueError, match="at least 3"):
        rank_quality(timed_programs[:2], ["analytic"])


def test_cli_compare_json(capsys):
    size = ",".join(map(str, SMALL))
    assert main(["experiment", "compare", "matmul", "--size", size, "--rules-b=-pack",
                 "--samples", "20", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"workload", "size", "a", "b", "a_in_b", "b_in_a", "statements"}
    assert out["a"]["label"] == "default" and out["b"]["label"] == "-pack"
    assert out["b_in_a"]["fraction"] == 1.0 and out["a"]["programs"] > out["b"]["programs"]


def test_cli_distribution_and_ranking_json_reuse_the_database(capsys, tmp_path):
    args = ["matmul", "--size", ",".join(map(str, SMALL)), "--samples", "4", "--repeats", "2",
            "--db", str(tmp_path / "x.db"), "--json"]
    assert main(["experiment", "distribution", *args]) == 0
    dist = json.loads(capsys.readouterr().out)
    assert dist["count"] == 4 and dist["correct_fraction"] == 1.0
    assert sum(int(re.search(r"GFLOPS\s+(\d+)", h).group(1)) for h in dist["histogram"]) == 4
    assert main(["experiment", "ranking", *args, "--models", "analytic,random"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["distribution"]["measured"] == 0
    assert set(out["ranking"]) == {"analytic", "random"}
    assert set(out["ranking"]["analytic"]) == {"n", "folds", "top_k", "spearman", "kendall",
                                               "top_recall", "top1_fraction"}


@pytest.mark.parametrize("argv, message", [
    (["compare", "matmul", "--rules-a", "tile,nosuchrule"], "unknown rule 'nosuchrule'"),
    (["compare", "matmul", "--samples", "0"], "--samples must be >= 1"),
    (["distribution", "matmul", "--samples", "0"], "--samples must be >= 1"),
    (["ranking", "matmul", "--models", "analytic,oracle9"], "unknown cost model 'oracle9'"),
])
def test_cli_errors_are_one_line(argv, message, capsys):
    assert main(["experiment", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eqsched: error: ") and message in err and "\n" not in err
