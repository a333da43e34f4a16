"""Space experiments: comparing two rule sets' spaces."""

import json

import pytest

from eqsched.cli import main
from eqsched.tools.compare import compare_spaces, wilson
from eqsched.workloads import get_workload

SMALL = get_workload("matmul").small_size


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


def test_both_spaces_take_the_targets_vector_lanes():
    cmp = compare_spaces("matmul", SMALL, "vectorize", "vectorize", samples=50,
                         vector_lanes=(4, 8, 16, 32))
    assert cmp.vector_lanes == [4, 8, 16, 32] and "4, 8, 16, 32 lanes" in cmp.text()


def test_spaces_no_larger_than_the_sample_are_tested_whole():
    cmp = compare_spaces("matmul", SMALL, "reorder", "vectorize", samples=50)
    assert cmp.a_in_b.exact and cmp.b_in_a.exact
    assert cmp.b.programs == 1 and cmp.b_in_a.tested == 1 and cmp.b_in_a.fraction == 1.0
    assert cmp.a_in_b.low == cmp.a_in_b.fraction == cmp.a_in_b.high
    assert "B ⊆ A exactly" in " ".join(cmp.statements)


def test_cli_compare_json(capsys):
    size = ",".join(map(str, SMALL))
    assert main(["experiment", "compare", "matmul", "--size", size, "--rules-b=-pack",
                 "--samples", "20", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"workload", "size", "a", "b", "a_in_b", "b_in_a", "statements",
                        "vector_lanes"}
    assert out["a"]["label"] == "default" and out["b"]["label"] == "-pack"
    assert out["b_in_a"]["fraction"] == 1.0 and out["a"]["programs"] > out["b"]["programs"]


@pytest.mark.parametrize("argv, message", [
    (["compare", "matmul", "--rules-a", "tile,nosuchrule"], "unknown rule 'nosuchrule'"),
    (["compare", "matmul", "--samples", "0"], "--samples must be >= 1"),
])
def test_cli_errors_are_one_line(argv, message, capsys):
    assert main(["experiment", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eqsched: error: ") and message in err and "\n" not in err
