"""Every script in examples/ runs, as a new user would run it, at its small size.

Each example takes `--small` (tiny sizes and budgets, files in a temporary directory given by
`--out`) so the suite can run all of them; hand_schedule.py takes a size and an output file.
"""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))
# The walkthrough in the README names these; each must exist and be runnable.
WALKTHROUGH = ("quick_start.py", "custom_workload.py", "custom_rule.py", "custom_cost_model.py",
               "batch_script.py", "space_experiment.py")


def small_args(script: str, out: Path) -> list[str]:
    if script == "hand_schedule.py":
        return ["64", str(out / "matmul-64.json")]
    return ["--small", "--out", str(out)]


def test_the_walkthrough_examples_exist():
    assert set(WALKTHROUGH) <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs_at_its_small_size(script, tmp_path):
    done = subprocess.run([sys.executable, str(EXAMPLES / script), *small_args(script, tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert done.stdout.strip(), f"{script} printed nothing"
    assert "Traceback" not in done.stderr
