"""`eqsched explore`, run as a user would: one JSON object, a replayable trace, one-line errors."""

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time

import pytest
from test_cli import ENV, assert_one_line_error

from eqsched.db import Database

SEARCH = ("--population", "16")  # these tests are about the command, not the search


def explore_cmd(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eqsched", "explore", *args],
                          capture_output=True, text=True, env=ENV, timeout=300, cwd=cwd)


def test_json_report_and_a_trace_that_eqsched_run_replays(tmp_path):
    db, trace = tmp_path / "x.db", tmp_path / "best.json"
    proc = explore_cmd("matmul", "--size", "16,32,8", "--trials", "4", "--batch", "4", *SEARCH,
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
    again = explore_cmd("matmul", "--size", "16,32,8", "--trials", "4", "--batch", "4", *SEARCH,
                        "--db", str(db), "--cost-model", "random", "--repeats", "2",
                        "--threads", "1", "--json")
    assert json.loads(again.stdout)["measured"] == 0


def test_a_learned_run_run_again_says_where_its_model_starts(tmp_path):
    db = str(tmp_path / "x.db")
    learned = ("matmul", "--size", "16,16,16", "--batch", "4", "--repeats", "2", "--threads",
               "1", *SEARCH, "--trials", "4", "--db", db, "--json")
    first = explore_cmd(*learned)
    assert first.returncode == 0, first.stderr
    again = explore_cmd(*learned)
    run = json.loads(first.stdout)["run_id"]
    assert (f"eqsched: the learned model starts from what run {run} of these settings started "
            f"from (0 stored measurements)") in again.stderr.splitlines()
    assert json.loads(again.stdout)["measured"] == 0


def test_a_corrupt_database_is_one_line(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"not a database at all" * 100)
    proc = explore_cmd("matmul", "--size", "16,32,8", "--trials", "1", "--db", str(bad))
    assert_one_line_error(proc, "not an eqsched database")


def test_an_unknown_cost_model_is_one_line(tmp_path):
    proc = explore_cmd("matmul", "--size", "16,32,8", "--db", str(tmp_path / "x.db"), *SEARCH,
                       "--cost-model", "oracle")
    assert_one_line_error(proc, "unknown cost model 'oracle'")


def test_a_bad_budget_is_one_line(tmp_path):
    proc = explore_cmd("matmul", "--trials", "0", "--db", str(tmp_path / "x.db"))
    assert_one_line_error(proc, "--trials must be >= 1")


def test_the_target_is_reported_and_stored(tmp_path):
    db = tmp_path / "x.db"
    proc = explore_cmd("matmul", "--size", "16,32,8", "--trials", "2", "--batch", "2", *SEARCH,
                       "--db", str(db), "--cost-model", "random", "--repeats", "1",
                       "--threads", "1", "--target", "haswell", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["target"] == "haswell"
    with Database(db) as d:
        assert {r.target for r in d.records(target=None)} == {"haswell"}


SMALL = ("matmul", "--size", "16,16,16", "--batch", "4", "--cost-model", "random", "--repeats",
         "2", "--threads", "1", *SEARCH)


def test_a_rerun_after_a_run_that_timed_out_everything_finds_the_correct_program(tmp_path):
    db = str(tmp_path / "x.db")
    hasty = explore_cmd(*SMALL, "--trials", "4", "--db", db, "--timeout", "0.0001")
    assert_one_line_error(hasty, "no correct program found in 4 trials")
    patient = explore_cmd(*SMALL, "--trials", "4", "--db", db, "--json")
    assert patient.returncode == 0, patient.stderr
    out = json.loads(patient.stdout)
    assert out["correct"] is True and out["measured"] == 4  # no stored timeout was reused


def _without_writing(tmp_path, how):
    """A command prefix and environment under which `tmp_path` cannot be written: a read-only
    mount of it (as root, whom file modes do not stop), or a file size limit of 0 (a full
    disk)."""
    if how == "full":
        def no_growth():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write fails (EFBIG) instead
            resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
        return [], no_growth
    if os.geteuid() != 0:
        tmp_path.chmod(0o555)
        return [], None
    mount = (f"mount --bind {tmp_path} {tmp_path} && mount -o remount,ro,bind {tmp_path} && "
             f"exec \"$@\"")
    return ["unshare", "-m", "sh", "-c", mount, "sh"], None


@pytest.mark.parametrize("how", ["read-only", "full"])
def test_a_database_that_cannot_be_written_is_refused_before_saturating(tmp_path, how):
    db = tmp_path / "x.db"
    Database(db).close()
    prefix, limit = _without_writing(tmp_path, how)
    try:
        proc = subprocess.run([*prefix, sys.executable, "-m", "eqsched", "explore", *SMALL,
                               "--trials", "4", "--db", str(db)], capture_output=True,
                              text=True, env=ENV, timeout=300, preexec_fn=limit)
    finally:
        tmp_path.chmod(0o755)
    assert_one_line_error(proc, f"{db}: cannot ")
    assert "saturating" not in proc.stderr


def test_an_unwritable_trace_file_is_refused_before_exploring(tmp_path):
    db = tmp_path / "x.db"
    proc = explore_cmd(*SMALL, "--trials", "4", "--db", str(db), "--save-trace",
                       str(tmp_path / "no such dir" / "best.json"))
    assert_one_line_error(proc, "cannot write the trace to")
    assert not db.exists()  # nothing was explored


@pytest.mark.parametrize("how", ["read-only", "full"])
def test_a_trace_file_that_could_not_be_written_is_refused_before_exploring(tmp_path, how):
    """A file opened for appending is not enough: the trace is written beside its place and
    renamed, which a read-only directory refuses, and a full disk refuses its first bytes."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "best.json").write_text("kept")
    prefix, limit = _without_writing(out, how)
    db = tmp_path / "x.db"
    try:
        proc = subprocess.run([*prefix, sys.executable, "-m", "eqsched", "explore", *SMALL,
                               "--trials", "4", "--db", str(db), "--save-trace",
                               str(out / "best.json")], capture_output=True, text=True,
                              env=ENV, timeout=300, preexec_fn=limit)
    finally:
        out.chmod(0o755)
    assert_one_line_error(proc, f"cannot write the trace to {out / 'best.json'}")
    assert not db.exists() and (out / "best.json").read_text() == "kept"


@pytest.mark.parametrize("option, value, message", [
    ("--seconds", "0", "seconds must be more than 0 and finite, got '0'"),
    ("--seconds", "nan", "got 'nan'"),
    ("--seed", "-1", "seed must be from 0 to 2**63 - 1, got -1"),
    ("--population", "1", "--population must be >= 2, got 1"),
    ("--rules", ",", "names no rule"),
    ("--limits", "iterations=0", "iterations must be an integer >= 1"),
    ("--save-trace", "", "no file name given for the trace"),
])
def test_a_bad_budget_seed_or_spec_is_refused_before_exploring(tmp_path, option, value,
                                                              message):
    db = tmp_path / "x.db"
    proc = explore_cmd(*SMALL, "--trials", "4", "--db", str(db), f"{option}={value}")
    assert_one_line_error(proc, message)
    assert not db.exists()


def _explore_in_background(db, trials):
    """An exploration in its own session (so that the test can end every process it leaves)."""
    return subprocess.Popen([sys.executable, "-m", "eqsched", "explore", *SMALL, "--trials",
                             str(trials), "--db", str(db)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True)


def _wait_for_measurements(db, proc, count):
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if db.exists():
            with Database(db, readonly=True) as d:
                if len(d.records()) >= count:
                    return
        time.sleep(0.2)
    raise AssertionError(f"no {count} measurements in time: {proc.poll()}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_exploration_keeps_its_measurements_and_resumes(tmp_path, signum):
    db = tmp_path / "x.db"
    proc = _explore_in_background(db, trials=8)  # killed in its first round of two
    try:
        _wait_for_measurements(db, proc, 2)
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=240)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the exploration left behind
        proc.wait()
    with Database(db) as d:
        (run,) = d.runs()
        kept = len(d.records())
    if signum == signal.SIGTERM:  # like Ctrl-C
        assert proc.returncode == 130, stderr
        assert "run the same command again to resume" in stderr and "Traceback" not in stderr
        assert run["status"] == "interrupted"
    else:
        assert run["status"] == "abandoned"
    listing = subprocess.run([sys.executable, "-m", "eqsched", "runs", "--db", str(db)],
                             capture_output=True, text=True, env=ENV, timeout=120)
    assert listing.returncode == 0 and f" {run['status']} " in listing.stdout.splitlines()[1]
    resumed = explore_cmd(*SMALL, "--trials", "8", "--db", str(db), "--json")
    assert resumed.returncode == 0, resumed.stderr
    out = json.loads(resumed.stdout)
    assert out["trials"] - out["measured"] >= kept - 1  # all but the naive program reused


def test_a_space_cut_by_the_time_limit_is_named_with_the_limits_that_build_it_again(tmp_path):
    """A saturation stopped by its clock depends on the machine's speed and load; the warning
    names the iterations it ran, and those limits build the same space anywhere."""
    common = ("matmul", "--size", "8,8,8", "--trials", "2", "--batch", "2", *SEARCH,
              "--cost-model", "random", "--repeats", "1", "--threads", "1", "--json")
    cut = explore_cmd(*common, "--db", str(tmp_path / "a.db"), "--limits", "seconds=0")
    assert cut.returncode == 0, cut.stderr
    warning = [line for line in cut.stderr.splitlines() if "time limit" in line]
    assert warning == ["eqsched: warning: saturation stopped at its time limit after 1 "
                       f"iterations ({json.loads(cut.stdout)['space']['seconds']:.0f} s); a "
                       "slower or busier machine builds a smaller space. To build this space "
                       "again anywhere: --limits iterations=1,seconds=3600"]
    again = explore_cmd(*common, "--db", str(tmp_path / "b.db"), "--limits",
                        "iterations=1,seconds=3600")
    assert again.returncode == 0, again.stderr
    assert "time limit" not in again.stderr
    first, second = (json.loads(p.stdout)["space"] for p in (cut, again))
    assert (first["stop_reason"], second["stop_reason"]) == ("time_limit", "iteration_limit")
    assert (first["programs"], first["enodes"]) == (second["programs"], second["enodes"])
