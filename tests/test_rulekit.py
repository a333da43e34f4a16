"""The rule kit: every default rule passes its soundness fuzz, and a wrong rule is caught by
executing what it produces, with the smallest failing program."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eqsched.backend import Target
from eqsched.rules import DEFAULT, RULES, RuleError
from eqsched.tools.rulekit import check_rule, load_module, rule_rows

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def wrong_rule():
    load_module(str(HERE / "wrong_rules.py"))
    return RULES["vectorize_unguarded"]


# Workloads where the rule has something to change (only conv2d's padding can be inlined;
# rfactor serves reductions of a small output: row statistics, a matrix-vector product).
WHERE = {"inline": ["conv2d_nchw"], "rfactor": ["softmax", "gemv"]}


@pytest.mark.parametrize("name", DEFAULT)
def test_every_default_rule_is_sound_on_the_programs_it_changes(name):
    workloads = WHERE.get(name, ["matmul", "mm_exp_mm"])
    check = check_rule(name, workloads=workloads, programs=1, measure=False)
    assert check.sound, check.failures[0]
    assert check.programs_checked >= 1
    assert [row["workload"] for row in check.effect] == workloads


def test_vectorize_is_sound_at_an_avx2_targets_vector_lanes():
    check = check_rule("vectorize", workloads=["matmul"], programs=2, measure=False,
                       target=Target.parse("host,-avx512f"))
    assert check.sound, check.failures[0]
    assert check.programs_checked >= 1


def test_the_wrong_rule_is_flagged_with_its_smallest_failing_program(wrong_rule):
    check = check_rule(wrong_rule, workloads=["matmul", "batch_matmul"], programs=2,
                       measure=False)
    assert not check.sound
    smallest = check.failures[0]
    assert [f.weight for f in check.failures] == sorted(f.weight for f in check.failures)
    assert smallest.before != smallest.after
    # Executing it fails: the backend refuses a vector loop whose lanes would race on one
    # accumulator (a reduced axis vectorized).
    assert smallest.kind == "run failed" and "vectorized loop" in smallest.detail
    assert smallest.legality.startswith("illegal")


def test_the_cli_checks_a_rule_from_a_file_and_exits_1_when_unsound():
    done = subprocess.run([sys.executable, "-m", "eqsched", "rules", "check",
                           "vectorize_unguarded", "--module", str(HERE / "wrong_rules.py"),
                           "--workloads", "matmul", "--programs", "1", "--no-measure", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    assert out["sound"] is False and out["failures"][0]["workload"] == "matmul"


def test_rules_list_shows_each_rule_with_its_pattern():
    rows = {r["name"]: r for r in rule_rows()}
    assert set(DEFAULT) <= set(rows)
    assert rows["tile"]["default"] and rows["tile"]["kind"] == "growth"
    assert rows["nesting"]["kind"] == "analysis"
    assert all("->" in rows[name]["pattern"] for name in DEFAULT)
    done = subprocess.run([sys.executable, "-m", "eqsched", "rules", "list"],
                          capture_output=True, text=True)
    assert done.returncode == 0 and "vectorize" in done.stdout


def test_the_template_rule_loads_and_checks(tmp_path):
    load_module(str(HERE.parent / "rules" / "template.py"))
    check = check_rule("unroll_innermost", workloads=["softmax"], programs=1, measure=False)
    assert check.sound and check.programs_checked >= 1


def test_unknown_rules_and_analysis_rules_are_refused():
    with pytest.raises(RuleError, match="unknown rule 'nope'"):
        check_rule("nope")
    with pytest.raises(RuleError, match="analysis rule"):
        check_rule("nesting")
    done = subprocess.run([sys.executable, "-m", "eqsched", "rules", "check", "nope"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1


def test_a_rule_module_that_is_not_python_is_refused(tmp_path):
    (tmp_path / "rules.txt").write_text("not python\n")
    with pytest.raises(RuleError, match=r"rule module .*rules.txt is not a Python file \(.py\)"):
        load_module(str(tmp_path / "rules.txt"))
    with pytest.raises(RuleError, match="no rule module"):
        load_module(str(tmp_path))
