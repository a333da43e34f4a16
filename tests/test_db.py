"""The results database: storing measurements, resuming, the best program, targets, old
databases, bad files, JSON lines."""

import dataclasses
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from eqsched.db import (
    ABANDONED,
    SCHEMA_VERSION,
    Database,
    DatabaseError,
    Record,
    error_kind,
    machine_fingerprint,
    training_rows,
    training_set,
    workload_key,
)

SIZE = [64, 32, 16]
TRACE = [{"op": "split", "args": {"loop": "C.i", "factors": [8]}}]


def record(program_hash: str, median_s: float | None = 1e-3, correct: bool | None = True,
           error: str | None = None, **extra) -> Record:
    fields = dict(workload="matmul", size=list(SIZE), program_hash=program_hash,
                  structure="C.i[0/2]{C.update}", sizes={"C.i|0/2": 8}, trace=TRACE,
                  times=[] if median_s is None else [median_s] * 3, median_s=median_s,
                  gflops=None if median_s is None else 0.1 / median_s, correct=correct,
                  error=error)
    return Record(**{**fields, **extra})


def start(db: Database, seed: int = 0) -> int:
    return db.start_run(workload="matmul", size=SIZE, seed=seed, budget={"trials": 8},
                        rules=["tile", "reorder"], cost_model="random",
                        machine={"cpu_model": "test cpu"}, versions={"eqsched": "0.1.0"})


@pytest.fixture
def db(tmp_path):
    with Database(tmp_path / "results.db", machine_fp="here") as db:
        yield db


def test_workload_key_names_the_problem():
    assert workload_key("matmul", (512, 256, 64)) == "matmul/512x256x64"
    with pytest.raises(ValueError, match="no '/'"):
        workload_key("a/b", [1])
    with pytest.raises(ValueError, match="positive"):
        workload_key("matmul", [0, 1])


def test_a_record_comes_back_as_it_was_added(db):
    run = start(db)
    added = record("h1", predicted_s=2e-3, round=0, run_id=run)
    assert db.add(added)
    assert added.created_at > 0 and added.machine_fp == "here"
    assert db.lookup("matmul", SIZE, "h1") == added
    assert db.records() == db.records("matmul") == db.records("matmul", SIZE, run_id=run) == [added]
    assert db.records("matmul", [1, 2, 3]) == db.records("conv2d") == []


def test_resume_finds_a_measured_program_and_a_second_add_keeps_the_first(tmp_path):
    path = tmp_path / "results.db"
    with Database(path, machine_fp="here") as db:
        assert db.lookup("matmul", SIZE, "h1") is None
        assert db.add(record("h1", median_s=1e-3))
    with Database(path, machine_fp="here") as reopened:
        assert reopened.lookup("matmul", SIZE, "h1").median_s == 1e-3
        assert not reopened.add(record("h1", median_s=5e-3))
        assert [r.median_s for r in reopened.records()] == [1e-3]


def test_best_is_the_fastest_correct_measurement(db):
    db.add(record("slow", median_s=3e-3))
    db.add(record("fast", median_s=2e-3))
    db.add(record("wrong", median_s=1e-3, correct=False))
    db.add(record("crashed", median_s=None, correct=None, error="worker crashed (SIGSEGV)"))
    db.add(record("unchecked", median_s=0.5e-3, correct=None))
    assert db.best("matmul", SIZE).program_hash == "fast"
    assert db.best("matmul", [8, 8, 8]) is None


def test_another_machines_record_is_kept_but_not_answered_for(db):
    db.add(record("h1", median_s=1e-4, machine_fp="elsewhere"))
    assert db.lookup("matmul", SIZE, "h1") is None
    assert db.best("matmul", SIZE) is None
    assert db.records() == []
    assert [r.machine_fp for r in db.records(all_machines=True)] == ["elsewhere"]
    assert db.add(record("h1", median_s=2e-3))  # this machine measures it for itself
    assert db.best("matmul", SIZE).median_s == 2e-3


# ---- failures and settings -------------------------------------------------------------------


@pytest.mark.parametrize("error, kind", [
    ("timed out after 0.001 s (worker killed)", "transient"),
    ("worker process died: killed by SIGKILL", "transient"),
    ("MemoryError: Unable to allocate 75.0 GiB (at reference.py:40)", "transient"),
    ("OSError: [Errno 28] No space left on device (at runner.py:90)", "transient"),
    ("interrupted", "transient"),
    ("something nobody foresaw", "transient"),  # not clearly deterministic: measured again
    ("wrong result: max error 3.5 at C[0, 1] (tolerance 1e-05)", "deterministic"),
    ("no replayable trace: split of C.i does not divide", "deterministic"),
    ("BackendError: vectorize of C.j: extent 3 (at lower.py:120)", "deterministic"),
    (None, None),
])
def test_an_error_is_transient_unless_it_is_clearly_deterministic(error, kind):
    assert error_kind(error) == kind


def test_the_measurers_own_kind_wins_over_the_text():
    assert error_kind("worker process died: killed by SIGSEGV", "deterministic") == \
        "deterministic"
    assert error_kind(None, "transient") is None
    with pytest.raises(ValueError, match="'flaky' is not one of transient, deterministic"):
        error_kind("boom", "flaky")


def test_a_transient_failure_is_measured_again_and_a_deterministic_one_is_not(db):
    assert db.add(record("slow", median_s=None, correct=False,
                         error="timed out after 0.001 s (worker killed)"))
    assert db.add(record("bad", median_s=None, correct=False, error="wrong result: NaN"))
    assert db.lookup("matmul", SIZE, "slow") is None  # for measuring again
    assert db.lookup("matmul", SIZE, "bad").error_kind == "deterministic"
    assert not db.add(record("slow", median_s=None, correct=False,
                             error="worker process died: killed by SIGKILL"))
    assert db.add(record("slow", median_s=2e-3))  # the new measurement replaces the failure
    assert not db.add(record("bad", median_s=1e-3))
    assert db.lookup("matmul", SIZE, "slow").median_s == 2e-3
    assert [(r.program_hash, r.error_kind) for r in db.records()] == [
        ("bad", "deterministic"), ("slow", None)]


SETTINGS = {"input_seed": 0, "min_repeats": 3, "repeats": 10, "time_budget_s": 0.3, "warmup": 1}


def test_a_measurement_is_looked_up_only_with_the_settings_it_was_taken_with(db):
    assert db.add(record("h1", median_s=1e-3, settings=SETTINGS))
    assert db.lookup("matmul", SIZE, "h1", settings=SETTINGS).median_s == 1e-3
    other_inputs = {**SETTINGS, "input_seed": 1}
    assert db.lookup("matmul", SIZE, "h1", settings=other_inputs) is None
    assert db.lookup("matmul", SIZE, "h1") is None
    assert db.add(record("h1", median_s=3e-3, settings=other_inputs))  # a second record
    assert db.best("matmul", SIZE).median_s == 1e-3  # the best of any settings


# ---- targets ---------------------------------------------------------------------------------

AVX2 = "host,-avx512f"


def test_records_of_two_targets_never_mix(db):
    assert db.add(record("h1", median_s=1e-3))  # the host by default
    assert db.add(record("h1", median_s=3e-3, target=AVX2))  # the same program, another target
    assert not db.add(record("h1", median_s=9e-3, target=AVX2))  # kept as it was
    assert db.lookup("matmul", SIZE, "h1").median_s == 1e-3
    assert db.lookup("matmul", SIZE, "h1", target=AVX2).median_s == 3e-3
    assert db.lookup("matmul", SIZE, "h1", target="haswell") is None
    db.add(record("h2", median_s=2e-3, target=AVX2))
    assert db.best("matmul", SIZE).program_hash == "h1"
    assert db.best("matmul", SIZE, target=AVX2).program_hash == "h2"
    assert [r.target for r in db.records()] == ["host"]
    assert [r.program_hash for r in db.records(target=AVX2)] == ["h1", "h2"]
    assert len(db.records(target=None)) == 3


def test_training_rows_are_one_targets(db):
    db.add(record("h1", median_s=1e-3, trace=[]))
    db.add(record("h2", median_s=2e-3, trace=[], target=AVX2))
    assert [r.program_hash for r in training_rows(db)] == ["h1"]
    assert [r.program_hash for r in training_rows(db, target=AVX2)] == ["h2"]


# Made by eqsched at commit 4f6d35d (schema version 1, before targets): one run with two
# measurements, h1 (1 ms) and h2 (2 ms) of matmul 64x32x16, on the machine fingerprinted "here".
SCHEMA_V1 = Path(__file__).parent / "data" / "schema_v1.sqlite"


def stored_schema_version(path: Path) -> str:
    """The schema version as written in the database file at `path`, read with sqlite3 alone."""
    conn = sqlite3.connect(path)
    try:
        (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    finally:
        conn.close()
    return version


def test_a_version_1_database_reads_as_the_hosts_and_is_migrated_on_writing(tmp_path):
    path = tmp_path / "old.db"
    shutil.copy(SCHEMA_V1, path)
    with Database(path, readonly=True, machine_fp="here") as old:
        assert [(r.program_hash, r.target) for r in old.records()] == [("h1", "host"),
                                                                      ("h2", "host")]
        assert old.best("matmul", SIZE).program_hash == "h1"
        assert old.lookup("matmul", SIZE, "h1", target=AVX2) is None
    assert SCHEMA_V1.read_bytes() == path.read_bytes()  # reading changed nothing
    with Database(path, machine_fp="here") as db:
        assert db.lookup("matmul", SIZE, "h2").median_s == 2e-3
        assert not db.add(record("h1", median_s=5e-3))  # the host's, measured before
        assert db.add(record("h1", median_s=5e-3, target=AVX2))
        assert db.runs()[0]["status"] == "done"
    assert stored_schema_version(path) == str(SCHEMA_VERSION)


# Made by eqsched at commit cd929e0 (schema version 2, before error kinds, settings and run
# processes), machine "here", matmul 64x32x16: run 1 (done; repeats 5) measured the naive program
# (5 ms), h1 (1 ms), and failures: a timeout, a wrong result, a dead worker, a compile error;
# run 2 is still marked running.
SCHEMA_V2 = Path(__file__).parent / "data" / "schema_v2.sqlite"
V2_SETTINGS = {**SETTINGS, "repeats": 5}


@pytest.mark.parametrize("readonly", [True, False])
def test_a_version_2_database_gets_error_kinds_and_its_runs_settings(tmp_path, readonly):
    path = tmp_path / "old.db"
    shutil.copy(SCHEMA_V2, path)
    with Database(path, readonly=readonly, machine_fp="here") as db:
        kinds = {r.program_hash: r.error_kind for r in db.records()}
        assert kinds == {"naive": None, "h1": None, "timedout": "transient",
                         "wrong": "deterministic", "died": "transient", "compile": "deterministic"}
        assert db.lookup("matmul", SIZE, "h1", settings=V2_SETTINGS).median_s == 1e-3
        assert db.lookup("matmul", SIZE, "timedout", settings=V2_SETTINGS) is None
        assert db.lookup("matmul", SIZE, "wrong", settings=V2_SETTINGS) is not None
        # The naive program was measured once, without warmup, whatever the run's settings.
        naive = {**V2_SETTINGS, "repeats": 1, "warmup": 0, "min_repeats": 1,
                 "time_budget_s": None}
        assert db.lookup("matmul", SIZE, "naive", settings=naive).median_s == 5e-3
        # Runs from before processes were recorded cannot be told abandoned.
        assert [(r["status"], r["pid"]) for r in db.runs()] == [("done", None), ("running", None)]
    if readonly:
        assert SCHEMA_V2.read_bytes() == path.read_bytes()  # reading changed nothing
        return
    assert stored_schema_version(path) == str(SCHEMA_VERSION)


# Made by eqsched at commit 8380c28 (schema version 3, before runs recorded what their learned
# model started from), machine "here", matmul 64x32x16: run 1 (done) measured h1 (1 ms) and h2
# (2 ms) with SETTINGS.
SCHEMA_V3 = Path(__file__).parent / "data" / "schema_v3.sqlite"


@pytest.mark.parametrize("readonly", [True, False])
def test_a_version_3_databases_runs_started_from_no_known_training_set(tmp_path, readonly):
    path = tmp_path / "old.db"
    shutil.copy(SCHEMA_V3, path)
    with Database(path, readonly=readonly, machine_fp="here") as db:
        (run,) = db.runs()
        assert run["status"] == "done" and run["learned_from"] is None
        assert [r.program_hash for r in training_rows(db)] == ["h1", "h2"]
        if not readonly:
            later = db.start_run(workload="matmul", size=SIZE, seed=0, budget={}, rules=[],
                                 cost_model="learned", machine={}, versions={},
                                 learned_from=training_set(training_rows(db), "here"))
            assert db.runs()[-1]["learned_from"]["count"] == 2 and later == 2
    if readonly:
        assert SCHEMA_V3.read_bytes() == path.read_bytes()  # reading changed nothing
        return
    assert stored_schema_version(path) == str(SCHEMA_VERSION)


def test_a_training_set_names_the_measurements_stored_until_a_row(db):
    for name in ("h1", "h2", "h3"):
        db.add(record(name))
    first_two = training_rows(db, until=2)
    assert [r.program_hash for r in first_two] == ["h1", "h2"]
    mark = training_set(first_two, "here")
    assert mark["until"] == 2 and mark["count"] == 2 and mark["machine"] == "here"
    assert training_set(training_rows(db, until=mark["until"]), "here") == mark
    assert training_set(training_rows(db), "here") != mark
    assert training_set([], "here")["until"] == 0


def test_runs_like_are_the_runs_of_exactly_these_settings(db):
    def begin(seed=0, budget=None, config=None):
        return db.start_run(workload="matmul", size=SIZE, seed=seed,
                            budget=budget or {"trials": 8}, rules=["tile"],
                            cost_model="learned", machine={}, versions={},
                            config=config or {"target": "host", "repeats": 10})

    same = [begin(), begin(config={"target": "host", "repeats": 10, "max_memory": 2 << 30})]
    begin(seed=1), begin(budget={"trials": 16}), begin(config={"target": "host", "repeats": 5})
    like = db.runs_like("matmul", SIZE, seed=0, budget={"trials": 8}, rules=["tile"],
                        cost_model="learned", config={"target": "host", "repeats": 10})
    assert [run["id"] for run in like] == same  # the memory cap does not tell runs apart
    assert db.runs_like("matmul", SIZE, seed=0, budget={"trials": 8}, rules=["tile"],
                        cost_model="random", config={"target": "host", "repeats": 10}) == []


def test_runs_are_started_and_finished(db):
    run = start(db, seed=7)
    db.add(record("h1", run_id=run))
    db.finish_run(run, status="done", summary={"best_s": 1e-3})
    (info,) = db.runs("matmul", SIZE)
    assert info["id"] == run and info["seed"] == 7 and info["size"] == SIZE
    assert info["status"] == "done" and info["summary"] == {"best_s": 1e-3}
    assert info["finished_at"] >= info["started_at"] and info["config"] is None
    assert db.runs("conv2d") == []
    with pytest.raises(ValueError, match="'finished' is not one of done"):
        db.finish_run(run, status="finished", summary={})
    with pytest.raises(DatabaseError, match="has no run 99"):
        db.finish_run(99, status="done", summary={})
    with pytest.raises(DatabaseError, match="has no run 99"):
        db.add(record("h2", run_id=99))


def test_a_run_records_its_process_and_shows_abandoned_once_that_is_gone(tmp_path):
    path = tmp_path / "results.db"
    # Another process starts a run and dies without finishing it (kill -9, a crash).
    script = ("import os, sys; from eqsched.db import Database\n"
              "db = Database(sys.argv[1], machine_fp='here')\n"
              "db.start_run(workload='matmul', size=[64, 32, 16], seed=0, budget={}, rules=[], "
              "cost_model='random', machine={}, versions={})\n"
              "os._exit(1)")
    subprocess.run([sys.executable, "-c", script, str(path)], check=False, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    with Database(path, machine_fp="here") as db:
        mine = start(db)
        dead, alive = db.runs()
        assert dead["status"] == ABANDONED and dead["host"] == alive["host"]
        assert alive["id"] == mine and alive["status"] == "running"
        assert alive["pid"] == os.getpid() and alive["process"]
    # The same pid given to another process later (a reboot, pid reuse) is not this run's.
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE runs SET process = 'another boot/1' WHERE id = ?", (mine,))
    conn.close()
    with Database(path, machine_fp="here") as db:
        assert db.runs()[1]["status"] == ABANDONED
        db.finish_run(mine, status="interrupted", summary={})
        assert db.runs()[1]["status"] == "interrupted"  # a finished run is what it says


def test_numpy_numbers_are_stored_as_plain_numbers(db):
    np = pytest.importorskip("numpy")
    db.add(record("h1", median_s=np.float32(0.5), sizes={"C.i|0/2": np.int64(8)}))
    (stored,) = db.records()
    assert stored.median_s == 0.5 and stored.sizes == {"C.i|0/2": 8}
    with pytest.raises(ValueError, match="trace is not JSON-able"):
        db.add(record("h2", trace=[{"op": object()}]))


def test_a_readonly_database_reads_but_does_not_write(tmp_path):
    path = tmp_path / "results.db"
    with Database(path, machine_fp="here") as db:
        db.add(record("h1"))
    with Database(path, readonly=True, machine_fp="here") as db:
        assert db.lookup("matmul", SIZE, "h1") is not None
        with pytest.raises(DatabaseError, match="read-only"):
            db.add(record("h2"))
    with pytest.raises(DatabaseError, match="does not exist"):
        Database(tmp_path / "missing.db", readonly=True)


def test_the_default_fingerprint_is_a_short_stable_hash():
    assert machine_fingerprint() == machine_fingerprint()
    assert len(machine_fingerprint()) == 12


# ---- files that are not eqsched databases ---------------------------------------------------


def test_random_bytes_are_not_a_database(tmp_path):
    path = tmp_path / "noise.db"
    path.write_bytes(os.urandom(4096))
    with pytest.raises(DatabaseError, match=r"noise.db is not an eqsched database \(file is not "
                                            r"a SQLite database\)"):
        Database(path)


def test_a_truncated_database_is_reported_as_such(tmp_path):
    path = tmp_path / "results.db"
    with Database(path, machine_fp="here") as db:
        for n in range(200):
            db.add(record(f"h{n}", structure="x" * 500))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatabaseError, match="results.db is corrupt or truncated"):
        Database(path)


def test_another_applications_sqlite_file_names_its_tables(tmp_path):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
        conn.execute("CREATE TABLE orders (id INTEGER)")
    conn.close()
    with pytest.raises(DatabaseError, match="other.db is not an eqsched database .*tables "
                                            "orders, users"):
        Database(path)
    with sqlite3.connect(path) as conn:  # opening it changed nothing
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()


def test_a_newer_schema_version_is_refused(tmp_path):
    path = tmp_path / "results.db"
    Database(path, machine_fp="here").close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                     (str(SCHEMA_VERSION + 1),))
    conn.close()
    newer = SCHEMA_VERSION + 1
    with pytest.raises(DatabaseError, match=rf"newer eqsched \(schema version {newer}; this "
                                            rf"eqsched reads version {SCHEMA_VERSION}\)"):
        Database(path)


def test_a_directory_or_a_missing_directory_is_refused(tmp_path):
    with pytest.raises(DatabaseError, match="is a directory"):
        Database(tmp_path)
    with pytest.raises(DatabaseError, match="nowhere is not a directory"):
        Database(tmp_path / "nowhere" / "results.db")


def test_a_new_database_in_a_directory_that_cannot_be_written_is_refused(tmp_path,
                                                                          monkeypatch):
    closed = tmp_path / "closed"
    closed.mkdir()
    real_access = os.access
    # Root writes past file modes: the directory is shown as unwritable to this process.
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == closed
                        else real_access(path, mode))
    with pytest.raises(DatabaseError, match=f"cannot create {closed / 'x.db'}: {closed} is "
                                            f"not writable"):
        Database(closed / "x.db")
    assert list(closed.iterdir()) == []


def test_an_empty_file_becomes_a_database(tmp_path):
    path = tmp_path / "results.db"
    path.touch()
    with Database(path, machine_fp="here") as db:
        assert db.add(record("h1"))


# ---- JSON lines ----------------------------------------------------------------------------


def test_an_export_that_cannot_be_written_is_a_database_error(db, tmp_path):
    # The batch's tasks export their rows beside a database whose disk may fill up: an
    # OSError there was an "internal error" of the command line.
    with pytest.raises(DatabaseError, match=r"cannot write .*nowhere/x.jsonl \(No such file"):
        db.export_jsonl(tmp_path / "nowhere" / "x.jsonl")


def test_export_then_import_gives_equal_records_and_runs(db, tmp_path):
    run = start(db)
    db.add(record("h1", run_id=run, round=0))
    db.add(record("h2", median_s=None, correct=None, error="timeout", run_id=run, round=1))
    db.add(record("h3", machine_fp="elsewhere"))
    db.finish_run(run, status="interrupted", summary={"measured": 2})
    out = tmp_path / "export.jsonl"
    assert db.export_jsonl(out) == 4
    assert [json.loads(line)["type"] for line in out.read_text().splitlines()] == \
        ["run", "measurement", "measurement", "measurement"]

    with Database(tmp_path / "fresh.db", machine_fp="here") as fresh:
        start(fresh, seed=1)  # ids differ from the exported ones: runs are re-linked
        assert fresh.import_jsonl(out) == 3
        assert fresh.records(all_machines=True) == [
            dataclasses.replace(r, run_id=None if r.run_id is None else 2)
            for r in db.records(all_machines=True)]
        assert fresh.runs()[1:] == [dict(db.runs()[0], id=2)]
        # A second import finds the same run and the same measurements.
        assert fresh.import_jsonl(out) == 0
        assert len(fresh.runs()) == 2


def test_a_copy_and_an_export_of_some_runs_carry_a_batch_tasks_rows(db, tmp_path):
    # A batch task explores into a copy and sends back only the runs it started.
    before = start(db)
    db.add(record("h1", run_id=before))
    db.copy_to(tmp_path / "task.db")
    with Database(tmp_path / "task.db", machine_fp="here") as task:
        assert task.records() == db.records() and task.runs() == db.runs()
        new = start(task, seed=1)
        task.add(record("h2", run_id=new))
        assert task.export_jsonl(tmp_path / "rows.jsonl", run_ids={new}) == 2
    assert db.import_jsonl(tmp_path / "rows.jsonl") == 1
    assert [r.program_hash for r in db.records()] == ["h1", "h2"]
    assert [r["seed"] for r in db.runs()] == [0, 1]


@pytest.mark.parametrize("bad_line, message", [
    ("{not json", "line 2: not JSON"),
    ('{"type": "cake"}', 'line 2: expected an object with "type"'),
    ('{"type": "measurement", "workload": "matmul"}', "line 2: measurement fields: missing"),
    ('{"type": "run", "id": 9}', "line 2: run fields: missing"),
])
def test_import_names_the_malformed_line(db, tmp_path, bad_line, message):
    db.add(record("h1"))
    path = tmp_path / "export.jsonl"
    db.export_jsonl(path)
    path.write_text(path.read_text() + bad_line + "\n")
    with Database(tmp_path / "fresh.db", machine_fp="here") as fresh:
        with pytest.raises(DatabaseError, match=message):
            fresh.import_jsonl(path)
        assert fresh.records() == []  # nothing imported from a bad file


def test_a_measurement_exported_before_targets_imports_as_the_hosts(db, tmp_path):
    line = {"type": "measurement", **record("h1", machine_fp="here").__dict__}
    del line["target"]
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(line) + "\n")
    assert db.import_jsonl(path) == 1
    assert db.lookup("matmul", SIZE, "h1").target == "host"


def test_import_checks_field_types_and_run_references(db, tmp_path):
    good = {"type": "measurement", **record("h1", run_id=5, machine_fp="x").__dict__}
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(good) + "\n")
    with pytest.raises(DatabaseError, match="line 1: measurement refers to run 5"):
        db.import_jsonl(path)
    path.write_text(json.dumps({**good, "run_id": None, "median_s": "fast"}) + "\n")
    with pytest.raises(DatabaseError, match="line 1: measurement field median_s is str"):
        db.import_jsonl(path)
    path.write_text(json.dumps({**good, "run_id": None, "error_kind": "flaky"}) + "\n")
    with pytest.raises(DatabaseError, match="line 1: measurement field error_kind is 'flaky'"):
        db.import_jsonl(path)


def test_a_file_exported_before_error_kinds_and_settings_imports_with_them(db, tmp_path):
    old = {"type": "measurement", **record("h1", median_s=None, correct=None,
                                            error="timed out after 1 s (worker killed)",
                                            machine_fp="here").__dict__}
    del old["error_kind"], old["settings"]
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n")
    assert db.import_jsonl(path) == 1
    (imported,) = db.records()
    assert imported.error_kind == "transient" and imported.settings == {}


# ---- two processes, one file ----------------------------------------------------------------

_WRITER = """
import sys
from eqsched.db import Database, Record
with Database(sys.argv[1], machine_fp="here") as db:
    for n in range(20):
        db.add(Record("matmul", [4], f"{sys.argv[2]}{n}", "", {}, [], [1.0], 1.0, 1.0, True,
                      None))
"""


def test_two_processes_write_to_one_file(tmp_path):
    path = tmp_path / "results.db"
    Database(path, machine_fp="here").close()
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), prefix])
               for prefix in "ab"]
    assert [w.wait(timeout=60) for w in writers] == [0, 0]
    with Database(path, machine_fp="here") as db:
        assert len(db.records("matmul", [4])) == 40


def test_training_rows_are_one_machines_correct_timings_at_one_thread_count(tmp_path):
    with Database(tmp_path / "t.db", machine_fp="here") as db:
        run = start(db)
        db.add(record("serial", 2e-3, run_id=run))
        db.add(record("par/threads=2", 1e-3, run_id=run))
        db.add(record("par/threads=1", 3e-3, run_id=run))
        db.add(record("wrong", 1e-3, correct=False, run_id=run))
        db.add(record("crashed", None, correct=None, error="crash", run_id=run))
        db.add(record("elsewhere", 1e-3, run_id=run, machine_fp="there"))
        db.add(dataclasses.replace(record("softmax", 1e-3, run_id=run), workload="softmax",
                                   size=[4, 4]))
        hashes = [r.program_hash for r in training_rows(db, threads=2)]
        assert hashes == ["serial", "par/threads=2", "softmax"]
        assert [r.program_hash for r in training_rows(db, "there")] == ["elsewhere"]
        only = training_rows(db, workloads=["softmax"])
        assert [(r.key, r.median_s) for r in only] == [("softmax/4x4", 1e-3)]


def test_derived_values_are_a_cache_old_databases_open_without(tmp_path):
    path = tmp_path / "old.db"
    with Database(path) as db:
        db.add(record("a", run_id=start(db)))
        db._conn.execute("DROP TABLE derived")  # as written by an eqsched before the cache
    with Database(path, readonly=True) as db:
        assert db.derived("k", [1]) == {}
        with pytest.raises(DatabaseError, match="read-only"):
            db.store_derived("k", {1: [1.0]})
    with Database(path) as db:  # opened for writing, it gains the table
        db.store_derived("k", {1: [1.0, 2.5]})
        assert db.derived("k", [1, 2]) == {1: [1.0, 2.5]} and db.derived("other", [1]) == {}
        assert db.export_jsonl(tmp_path / "x.jsonl") == 2  # a run and a measurement, no cache


def test_a_model_run_is_recorded_beside_the_runs_and_old_databases_open_without(tmp_path):
    path = tmp_path / "old.db"
    with Database(path, machine_fp="here") as db:
        db.add(record("a", run_id=start(db)))
        db._conn.execute("DROP TABLE model_runs")  # as written by an eqsched before model runs
    with Database(path, readonly=True) as db:
        assert db.model_runs() == []
        with pytest.raises(DatabaseError, match="read-only"):
            db.start_model_run(model="mlp", fingerprint="f", settings={}, machine={},
                               versions={})
    with Database(path, machine_fp="here") as db:  # opened for writing, it gains the table
        first = db.start_model_run(model="mlp", fingerprint="f1", settings={"trials": 8},
                                   machine={"cpu_model": "test cpu"}, versions={"eqsched": "0"})
        second = db.start_model_run(model="bert", fingerprint="f2", settings={}, machine={},
                                    versions={})
        db.finish_model_run(first, status="interrupted", summary={"curve": [[4, 1e-3]]})
        with pytest.raises(DatabaseError, match="has no model run 99"):
            db.finish_model_run(99, status="done", summary={})
        with pytest.raises(ValueError, match="run status 'over'"):
            db.finish_model_run(second, status="over", summary={})
        mlp, bert = db.model_runs()
        assert (mlp["model"], mlp["fingerprint"], mlp["status"]) == ("mlp", "f1", "interrupted")
        assert mlp["settings"] == {"trials": 8} and mlp["summary"] == {"curve": [[4, 1e-3]]}
        assert mlp["machine_fp"] == "here" and mlp["pid"] == os.getpid()
        assert mlp["finished_at"] >= mlp["started_at"] and bert["status"] == "running"
        assert [r["id"] for r in db.model_runs("bert")] == [second]
        # The runs of explorations know nothing of it: batch, report and compare read those.
        assert len(db.runs()) == 1
        assert db.export_jsonl(tmp_path / "x.jsonl") == 2  # a run and a measurement
