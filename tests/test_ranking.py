"""Space experiments: how well cost models rank a measured sample."""

import json
import re

import numpy as np
import pytest

from eqsched.cli import main
from eqsched.egraph.derive import DeriveError, realize
from eqsched.egraph.space import build_space
from eqsched.extract.cost import CostModel
from eqsched.ir import naive_program
from eqsched.rules import resolve
from eqsched.tools.ranking import curves_table, learning_curves, rank_quality
from eqsched.workloads import get_workload

SMALL = get_workload("matmul").small_size


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
        try:
            prog = realize(term, sizes, naive)
        except DeriveError:
            # A structure the primitives refuse (a local tile over a remainder split whose
            # indices the dependence analysis cannot read) is skipped, as the search skips it.
            continue
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
    (["ranking", "matmul", "--models", "analytic,oracle9"], "unknown cost model 'oracle9'"),
])
def test_cli_errors_are_one_line(argv, message, capsys):
    assert main(["experiment", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eqsched: error: ") and message in err and "\n" not in err


def _examples(workload: str, group: str, count: int, rng, informative: bool):
    """Examples whose first input orders their times (and the prior, last input, is noise)."""
    from eqsched.extract.features import FEATURE_NAMES
    from eqsched.extract.learned import Example

    out = []
    for i in range(count):
        x = rng.normal(size=len(FEATURE_NAMES) + 1)
        time = x[0] if informative else rng.normal()
        out.append((workload, Example(group, f"{group}/{i}", x, float(time))))
    return out


def test_learning_curves_show_trees_learning_what_the_prior_misses():
    rng = np.random.default_rng(0)
    rows = (_examples("matmul", "m1", 120, rng, True) + _examples("matmul", "m2", 120, rng, True)
            + _examples("conv2d_nchw", "c1", 150, rng, True))
    curves = learning_curves(rows, "matmul", sizes=(16, 128, 1024), draws=1)
    assert curves["held_out"] == 60 and curves["pool"] == 180 and curves["others"] == 150
    low, high, missing = curves["points"]
    # The prior here is noise; below min_samples the model predicts it, the unchecked trees
    # already try; with 128 programs the trees rank the held-out ones well. Trees fitted with
    # another workload's rows rank a size only once trained on MIN_PROBLEM_ROWS of it: 16
    # programs of two sizes are too few, 128 are enough.
    assert abs(low["prior"]["spearman"]) < 0.3 and low["same"]["fitted"] == 0
    assert low["same"]["spearman"] == low["prior"]["spearman"] and low["transfer"]["fitted"] == 1
    assert low["transfer"]["spearman"] == low["prior"]["spearman"]
    assert high["same"]["spearman"] > 0.6 and high["same"]["fitted"] == 1
    assert high["transfer"]["spearman"] > 0.6 and high["transfer"]["fitted"] == 1
    assert missing["same"] is None and missing["transfer"] is None
    assert "transfer adds 150 measurements of conv2d_nchw" in curves_table(curves)


def test_learning_curves_need_a_held_out_size():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="no size of matmul with 8 or more"):
        learning_curves(_examples("matmul", "m", 5, rng, True), "matmul")


def test_cli_curves_read_the_database_only(tmp_path, capsys):
    from eqsched.db import Database

    path = tmp_path / "empty.db"
    Database(path).close()
    assert main(["experiment", "ranking", "matmul", "--curves", "--db", str(path)]) == 2
    assert "no size of matmul" in capsys.readouterr().err
    assert main(["experiment", "ranking", "matmul", "--curves"]) == 2
    assert "name a database" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--folds", "1"], "--folds must be >= 2, got 1"),
    (["--plot", "c.png"], "--plot draws the learning curves: it needs --curves"),
    (["--curves", "--test-share", "1.5"], "--test-share must be between 0 and 1, got 1.5"),
    (["--curves"], "missing.db does not exist"),
    (["--curves", "--plot", "{tmp}/no dir/c.png"], "cannot write the plot"),
])
def test_cli_ranking_refuses_before_reading_or_measuring(tmp_path, capsys, argv, message):
    argv = [a.format(tmp=tmp_path) for a in argv]
    db = tmp_path / "missing.db"
    if "--plot" in argv and "--curves" in argv:
        from eqsched.db import Database

        Database(db).close()
    assert main(["experiment", "ranking", "matmul", "--db", str(db), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eqsched: error: ") and message in err and "\n" not in err
    assert "drawing" not in err  # nothing was measured
    assert db.exists() == ("--plot" in argv and "--curves" in argv)  # no database was created
