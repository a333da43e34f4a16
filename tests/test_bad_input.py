"""bench/bad_input.py, the bad-input table, kept honest: a few of its cases of each kind run
through its own `run_case` (the real command line), and its counts flag what they must."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bad_input.py"
if not BENCH.exists():
    pytest.skip("needs the repository checkout (bench/)", allow_module_level=True)
_spec = importlib.util.spec_from_file_location("bad_input", BENCH)
bad_input = importlib.util.module_from_spec(_spec)
sys.modules["bad_input"] = bad_input  # dataclasses look their module up by name
_spec.loader.exec_module(bad_input)

# One or two of each kind: options, budgets, traces, suites, files and databases.
REPRESENTATIVE = [
    "explore --timeout 1e400", "explore --seconds 0", 'trace: "loops": "C.i"',
    'trace: "size": "16"', "suite: [explore] (a table, not [[explore]])", "suite: seed = []",
    "--save-trace in a missing directory", "--db not SQLite",
]


def test_the_cases_have_distinct_names_and_say_what_names_the_problem():
    names = [case.name for case in bad_input.CASES]
    assert len(names) == len(set(names))
    assert all(case.names for case in bad_input.CASES)
    assert set(REPRESENTATIVE) <= set(names)


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_a_bad_input_is_refused_in_one_line_with_status_2(name):
    case = next(c for c in bad_input.CASES if c.name == name)
    row = bad_input.run_case(case)
    assert not row.traceback and not row.internal, row.line
    assert row.status == 2 and case.names in row.line, (row.status, row.line)
    assert row.line.startswith("eqsched: error: ")


def test_the_counts_flag_a_traceback_an_internal_error_and_a_success():
    case = bad_input.CASES[0]
    good = bad_input.Row(case, 2, f"eqsched: error: {case.names}", False, False, 1.0)
    assert not bad_input.failed([good])
    for bad in (bad_input.Row(case, 2, good.line, True, False),
                bad_input.Row(case, 2, "eqsched: error: internal error: TypeError: x", False,
                              True),
                bad_input.Row(case, 0, "", False, False),
                bad_input.Row(case, 1, good.line, False, False),
                bad_input.Row(case, 2, "eqsched: error: something else", False, False),
                bad_input.Row(case, "timeout", "", False, False)):
        assert bad_input.failed([good, bad])
    line = bad_input.table([good, bad_input.Row(case, 0, "", False, False)]).splitlines()[-1]
    assert line.startswith("tracebacks: 0, internal errors: 0, exit 0 on bad input: 1; ")
