"""`eqsched explore`, run as a user would: one JSON object, a replayable trace, one-line errors."""

import json
import subprocess
import sys

from test_cli import ENV, assert_one_line_error

from eqsched.db import Database


def explore_cmd(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eqsched", "explore", *args],
                          capture_output=True, text=True, env=ENV, timeout=300, cwd=cwd)


def test_json_report_and_a_trace_that_eqsched_run_replays(tmp_path):
    db, trace = tmp_path / "x.db", tmp_path / "best.json"
    proc = explore_cmd("matmul", "--size", "16,32,8", "--trials", "4", "--batch", "4",
                       "--db", str(db), "--cost-model", "random", "--repeats", "2",
                       "--threads", "1", "--save-trace", str(trace), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in ("workload", "size", "trials", "best_gflops", "best_median_s", "wall_s",
                "correct", "trace", "rounds"):
        assert key in out
    assert out["workload"] == "matmul" and out["size"] == [16, 32, 8] and out["trials"] == 4
    assert out["correct"] is True and out["best_gflops"] > 0
    assert 0 < out["percent_of_peak"] and out["peak_gflops"] > 0
    assert "spearman" in out["rounds"][0]
    replay = subprocess.run([sys.executable, "-m", "eqsched", "run", "matmul", "--schedule",
                             str(trace), "--repeats", "1", "--json", "--no-print"],
                            capture_output=True, text=True, env=ENV, timeout=300)
    assert replay.returncode == 0, replay.stderr
    assert json.loads(replay.stdout)["program_hash"] == out["best_hash"]
    again = explore_cmd("matmul", "--size", "16,32,8", "--trials", "4", "--batch", "4",
                        "--db", str(db), "--cost-model", "random", "--repeats", "2",
                        "--threads", "1", "--json")
    assert json.loads(again.stdout)["measured"] == 0


def test_a_corrupt_database_is_one_line(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"not a database at all" * 100)
    proc = explore_cmd("matmul", "--size", "16,32,8", "--trials", "1", "--db", str(bad))
    assert_one_line_error(proc, "not an eqsched database")


def test_an_unknown_cost_model_is_one_line(tmp_path):
    proc = explore_cmd("matmul", "--size", "16,32,8", "--db", str(tmp_path / "x.db"),
                       "--cost-model", "oracle")
    assert_one_line_error(proc, "unknown cost model 'oracle'")


def test_a_bad_budget_is_one_line(tmp_path):
    proc = explore_cmd("matmul", "--trials", "0", "--db", str(tmp_path / "x.db"))
    assert_one_line_error(proc, "--trials must be >= 1")


def test_the_target_is_reported_and_stored(tmp_path):
    db = tmp_path / "x.db"
    proc = explore_cmd("matmul", "--size", "16,32,8", "--trials", "2", "--batch", "2",
                       "--db", str(db), "--cost-model", "random", "--repeats", "1",
                       "--threads", "1", "--target", "haswell", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["target"] == "haswell"
    with Database(db) as d:
        assert {r.target for r in d.records(target=None)} == {"haswell"}
