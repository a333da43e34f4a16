"""`eqsched space`, run as a user would: one JSON object, exact counts, one-line errors."""

import json
import subprocess
import sys

from test_cli import ENV, assert_one_line_error

from eqsched.backend import Target
from eqsched.egraph.encode import encode
from eqsched.egraph.space import build_space
from eqsched.egraph.term import show, vector_lanes
from eqsched.ir import naive_program
from eqsched.rules import default_rules
from eqsched.schedule import Schedule
from eqsched.workloads import get_workload


def space_cmd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eqsched", "space", *args], capture_output=True,
                          text=True, env=ENV, timeout=300)


def test_json_report_counts_the_space_and_samples_replayable_traces():
    proc = space_cmd("matmul", "--size", "16,16,8", "--sample", "2", "--seed", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["stop_reason"] == "saturated"
    assert out["enodes"] > 0 and out["eclasses"] > 0 and out["seconds"] >= 0
    assert out["peak_rss_mb"] > 0 and out["matches_per_rule"]["tile"] > 0
    naive = naive_program(get_workload("matmul").build(16, 16, 8))
    # the command's space has the host target's vector lanes
    space = build_space(naive, default_rules(), vector_lanes=out["vector_lanes"])
    assert out["vector_lanes"] == list(vector_lanes(Target.host().vector_lanes))
    assert out["programs"] == space.count() and out["structures"] == space.count_structures()
    assert isinstance(out["programs"], int) and out["programs"] > out["structures"]
    assert len(out["samples"]) == 2
    # The same seed draws the same programs in another process (another egglog numbering).
    for sample, (term, sizes) in zip(out["samples"], space.sample(2, seed=3)):
        assert sample["term"] == show(term)
        assert sample["sizes"] == {f"{g}[{p}]": e for (g, p), e in sizes.items()}
        assert encode(Schedule.replay(naive, sample["trace"]).program) == (term, sizes)


def test_rule_edits_and_limits():
    full = json.loads(space_cmd("elementwise_chain", "--size", "64", "--json").stdout)
    fewer = json.loads(space_cmd("elementwise_chain", "--size", "64", "--rules=-tile",
                                 "--json").stdout)
    assert fewer["programs"] < full["programs"]
    capped = json.loads(space_cmd("matmul", "--size", "16,16,8", "--limits", "iterations=1",
                                  "--json").stdout)
    assert capped["stop_reason"] == "iteration_limit" and capped["iterations"] == 1


def test_contributions_count_the_space_without_each_rule():
    out = json.loads(space_cmd("elementwise_chain", "--size", "64", "--contributions",
                               "--json").stdout)
    contributions = out["contributions"]
    assert {"tile", "reorder", "vectorize"} <= set(contributions)
    assert all(n <= out["programs"] for n in contributions.values())
    assert contributions["tile"] < out["programs"]


def test_the_vector_lanes_follow_the_target():
    host = json.loads(space_cmd("matmul", "--size", "16,16,8", "--json").stdout)
    avx2 = json.loads(space_cmd("matmul", "--size", "16,16,8", "--json", "--target",
                                "host,-avx512f").stdout)
    assert host["vector_lanes"] == list(vector_lanes(Target.host().vector_lanes))
    assert avx2["target"] == "host,-avx512f" and avx2["vector_lanes"] == [4, 8, 16, 32]
    naive = naive_program(get_workload("matmul").build(16, 16, 8))
    assert avx2["programs"] == build_space(naive, default_rules(),
                                           vector_lanes=(4, 8, 16, 32)).count()
    assert avx2["structures"] == host["structures"]


def test_dot_output(tmp_path):
    proc = space_cmd("elementwise_chain", "--size", "8", "--rules", "tile",
                     "--dot", str(tmp_path / "space.svg"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "space.dot").read_text().startswith("digraph space {")
    assert "wrote" in proc.stdout


def test_errors_are_one_line():
    assert_one_line_error(space_cmd("matmul", "--limits", "nodes=5"), "bad --limits item")
    assert_one_line_error(space_cmd("matmul", "--rules=-nosuchrule"), "nosuchrule")
    assert_one_line_error(space_cmd("nosuchworkload"), "nosuchworkload")


def test_a_graph_file_that_could_not_be_written_is_refused_before_saturating(tmp_path,
                                                                              monkeypatch,
                                                                              capsys):
    import eqsched.egraph.saturate
    from eqsched.cli import main

    def never(*args, **kwargs):
        raise AssertionError("saturated before the graph file was checked")

    monkeypatch.setattr(eqsched.egraph.saturate, "saturate", never)
    assert main(["space", "matmul", "--size", "8,8,8", "--dot",
                 str(tmp_path / "no dir" / "space.svg")]) == 2
    assert capsys.readouterr().err == (f"eqsched: error: cannot write the graph to "
                                       f"{tmp_path / 'no dir' / 'space.dot'} (No such file or "
                                       f"directory)\n")
    assert main(["space", "matmul", "--dot", "."]) == 2
    assert "bad --dot '.': not a file name" in capsys.readouterr().err


def test_a_seed_or_rules_spec_that_cannot_be_one_is_refused():
    assert_one_line_error(space_cmd("matmul", "--seed", "-3", "--sample", "1"),
                          "seed must be from 0 to 2**63 - 1, got -3")
    assert_one_line_error(space_cmd("matmul", "--rules", ","), "names no rule")
