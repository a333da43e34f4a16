"""Batch exploration: suites parse and cross, jobs run in worker processes or Ray tasks, and a
batch resumes from the database without measuring anything twice."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from eqsched.db import Database
from eqsched.tools.batch import BatchError, Suite, run_batch, tasks_dir

TINY = """
[defaults]
trials = 2
batch = 2
population = 16
threads = 1
repeats = 2
cost_model = "analytic"
[[explore]]
workload = "matmul"
sizes = [[16, 16, 16], "small"]
"""


def suite(text: str) -> Suite:
    import tomllib

    return Suite.from_dict(tomllib.loads(text), "suite.toml")


def measured_hashes(db) -> list[str]:
    with Database(db) as d:
        return [r.program_hash for r in d.records()]


def test_lists_are_crossed_in_a_stable_order():
    s = suite("""
[defaults]
trials = 4
[[explore]]
workload = "matmul"
sizes = [[8, 8, 8], "small"]
cost_model = ["analytic", "random"]
seed = [0, 1]
""")
    assert len(s.jobs) == 2 * 2 * 2
    assert s.jobs[0].key == ("matmul/8x8x8 batch=16 cost_model=analytic repeats=10 seed=0 "
                             "target=host trials=4")
    assert [j.size for j in s.jobs[4:]] == [(16, 24, 8)] * 4


@pytest.mark.parametrize("text, message", [
    ('[[explore]]\nworkload = "nope"', "unknown workload 'nope'"),
    ('[[explore]]\nworkload = "matmul"\nsizes = [[8, 8]]', "takes 3 sizes"),
    ('[[explore]]\nworkload = "matmul"\ntrails = 3', "unknown key 'trails'"),
    ('[[explore]]\nworkload = "matmul"\ntrials = "many"', "trials = 'many' has the wrong type"),
    ('[[explore]]\nworkload = "matmul"\npopulation = 1', "population must be a whole number"),
    ('[[explore]]\nworkload = "matmul"\ncost_model = "oracle"', "unknown cost model 'oracle'"),
    ('[[explore]]\nworkload = "matmul"\nrules = "-nosuchrule"', "unknown rule"),
    ('[defaults]\ntrials = 3', "no [[explore]] entries"),
    ('[[explore]]\nworkload = "matmul"\ntarget = "nosuchcpu"', "LLVM knows no x86 CPU"),
    ('[[explore]]\nworkload = "matmul"\ntarget = ["host", "host,+nosuch"]',
     "'nosuch' is not an x86 feature"),
    ('[[explore]]\nworkload = "matmul"\nmax_memory = "lots"', "max memory must be a size"),
    ('[defaults]\nmax_memory = 1024\n[[explore]]\nworkload = "matmul"', "at least 256 MiB"),
    # the sections themselves of the wrong kind
    ('[explore]\nworkload = "matmul"', "explore must be [[explore]] tables, each with a "
                                       "workload, got a table ([name], not [[name]])"),
    ('explore = ["matmul"]', "got an array holding a string"),
    ('defaults = [1]\n[[explore]]\nworkload = "matmul"', "defaults must be a table"),
    ('[[defaults]]\ntrials = 2\n[[explore]]\nworkload = "matmul"', "defaults must be a table"),
    # a list crossed with the rest would leave no exploration: the batch ran nothing
    ('[[explore]]\nworkload = "matmul"\nseed = []', "seed = [] lists no value"),
    ('[defaults]\ncost_model = []\n[[explore]]\nworkload = "matmul"', "cost_model = [] lists"),
    ('[[explore]]\nworkload = "matmul"\nsizes = []', "sizes = [] lists no size"),
    ('[[explore]]\nworkload = "matmul"\nseed = -1', "seed must be from 0 to 2**63 - 1"),
    # a time budget of 0 or less, nan or inf saturated a space to measure nothing, or forever
    *((f'[[explore]]\nworkload = "matmul"\nseconds = {v}', "seconds must be more than 0 and "
        "finite") for v in ("0", "-1.5", "nan", "inf", "[10, 0]")),
    ('[[explore]]\nworkload = "matmul"\nsizes = [[8, 8, 8]]\nsize = [8, 8, 8]',
     "give sizes or size, not both"),
])
def test_a_malformed_suite_is_refused_before_anything_runs(text, message):
    with pytest.raises(BatchError, match="suite.toml") as err:
        suite(text)
    assert message in str(err.value)


def test_a_target_per_job_or_for_the_whole_suite():
    crossed = suite('[[explore]]\nworkload = "matmul"\ntarget = ["host", "host, -avx512f"]')
    assert [j.settings()["target"] for j in crossed.jobs] == ["host", "host,-avx512f"]
    given = Suite.from_dict({"explore": [{"workload": "matmul"},
                                         {"workload": "conv2d_nchw", "target": "host"}]},
                            "suite.toml", target="haswell")
    assert [j.settings()["target"] for j in given.jobs] == ["haswell", "host"]
    with pytest.raises(BatchError, match="the batch's target.*LLVM knows no x86 CPU"):
        Suite.from_dict({"explore": [{"workload": "matmul"}]}, "suite.toml", target="nosuch")


def test_a_memory_cap_per_job_or_for_the_whole_suite_in_bytes():
    crossed = suite('[[explore]]\nworkload = "matmul"\nmax_memory = ["8G", "1G"]')
    assert [j.settings()["max_memory"] for j in crossed.jobs] == [8 << 30, 1 << 30]
    with pytest.raises(BatchError, match="listed twice"):  # one cap, two spellings
        suite('[[explore]]\nworkload = "matmul"\nmax_memory = ["8G", "8192M"]')
    given = Suite.from_dict({"explore": [{"workload": "matmul"},
                                         {"workload": "conv2d_nchw", "max_memory": "1G"}]},
                            "suite.toml", max_memory=2 << 30)
    assert [j.settings()["max_memory"] for j in given.jobs] == [2 << 30, 1 << 30]
    assert suite(TINY).jobs[0].settings()["max_memory"] is None  # the runner's default


def test_a_jobs_target_is_stored_and_its_finished_run_is_found_again(tmp_path):
    db = tmp_path / "b.db"
    avx2 = suite(TINY.replace("[[explore]]", 'target = "host,-avx512f"\n[[explore]]')
                 .replace('"small"', ""))
    first = run_batch(avx2, db)
    assert [r["status"] for r in first.rows] == ["done"]
    with Database(db) as d:
        assert d.records() == [] and len(d.records(target="host,-avx512f")) == 3  # with naive
    again = run_batch(avx2, db)
    assert [(r["status"], r["note"]) for r in again.rows] == [("done", "from db")]


@pytest.fixture(scope="module")
def tiny_batch(tmp_path_factory):
    """TINY run once on two local task processes, which several tests read: its database, its
    result and the arguments each task process was started with."""
    import multiprocessing.context as mp

    db = tmp_path_factory.mktemp("batch") / "b.db"
    told: list[tuple] = []
    start = mp.SpawnProcess.start
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(mp.SpawnProcess, "start",
                            lambda self: (told.append(self._args), start(self))[1])
        result = run_batch(suite(TINY), db, jobs=2)
    return db, result, told


def test_a_batch_runs_every_job_and_a_rerun_takes_them_from_the_database(tiny_batch, tmp_path):
    db = tmp_path / "b.db"
    shutil.copy(tiny_batch[0], db)
    first = tiny_batch[1]
    assert [r["status"] for r in first.rows] == ["done", "done"]
    assert all(r["measured"] == 2 and r["best_gflops"] > 0 for r in first.rows)
    stored = measured_hashes(db)
    again = run_batch(suite(TINY), db, jobs=2)
    assert [(r["status"], r["measured"], r["note"]) for r in again.rows] == \
        [("done", 0, "from db")] * 2
    assert measured_hashes(db) == stored
    assert "from db" in again.table()


def task_records(db) -> dict[str, list]:
    """The measurements in each task database of the batches on `db` (beside it, in
    `b.db.tasks/driver-*/job*/task.db`), by the task's directory."""
    found = {}
    for task_db in sorted(tasks_dir(db).glob("driver-*/job*/task.db")):
        try:
            with Database(task_db, readonly=True) as d:
                found[task_db.parent.name] = d.records()
        except Exception:  # a copy not yet complete, or removed as its job ended
            pass
    return found


def wait_until_both_tasks_measured(db, proc, fewest: int = 2) -> None:
    """Each job explores into its own copy of the database until it ends: wait until both
    copies hold `fewest` measurements or more (the naive program's first) and one holds a
    candidate's."""
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
        counts = [len(records) for records in task_records(db).values()]
        if len(counts) == 2 and min(counts) >= fewest and max(counts) >= 2:
            return
    raise AssertionError("the batch's tasks did not measure in time")


def test_ctrl_c_stops_the_batch_and_a_rerun_resumes_without_remeasuring(tmp_path):
    longer = TINY.replace("trials = 2", "trials = 4")  # two rounds: one to interrupt
    (tmp_path / "s.toml").write_text(
        longer.replace('[[16, 16, 16], "small"]', "[[32, 32, 32], [48, 32, 16]]"))
    cmd = [sys.executable, "-m", "eqsched", "batch", "s.toml", "--jobs", "2", "--db", "b.db"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Their first rounds search for seconds each, not in step: waiting for a candidate stored
    # in both took 8 trials.
    wait_until_both_tasks_measured(tmp_path / "b.db", proc, fewest=1)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    before = measured_hashes(tmp_path / "b.db")
    with Database(tmp_path / "b.db") as d:
        assert "interrupted" in {r["status"] for r in d.runs()}
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    after = measured_hashes(tmp_path / "b.db")
    assert after[:len(before)] == before and len(set(after)) == len(after)
    with Database(tmp_path / "b.db") as d:
        runs = d.runs()
        resumed = [r for r in runs if r["id"] > max(r["id"] for r in runs) - 2]
        assert [r["status"] for r in resumed] == ["done", "done"]
        assert all(r["summary"]["trials"] == 4 for r in resumed)
        # What the resumed runs measured is exactly what was not stored before the interrupt.
        new = [r for r in d.records() if r.run_id in {x["id"] for x in resumed}
               and r.structure != "naive"]
        assert sum(r["summary"]["measured"] for r in resumed) == len(new) < 8


def test_the_cli_reports_a_bad_suite_in_one_line(tmp_path):
    (tmp_path / "bad.toml").write_text("[[explore]]\nworkload = 3\n")
    done = subprocess.run([sys.executable, "-m", "eqsched", "batch", "bad.toml"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "eqsched: error: bad.toml [[explore]] #1: 'workload' must be a workload name"]


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster of 2 CPUs for this file's Ray tests: starting one took 5-10 s, and
    each test's batch submits its own tasks to it."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def test_ray_runs_the_same_jobs_with_the_same_programs(tiny_batch, ray_cluster, tmp_path):
    by_ray = run_batch(suite(TINY), tmp_path / "ray.db", executor="ray")
    local_db, local, _ = tiny_batch
    assert [r["status"] for r in by_ray.rows] == ["done", "done"]
    assert [r["job"] for r in by_ray.rows] == [r["job"] for r in local.rows]
    assert sorted(measured_hashes(tmp_path / "ray.db")) == sorted(measured_hashes(local_db))


def test_a_killed_task_process_costs_only_its_job_which_is_retried_once(tmp_path):
    import threading

    import psutil

    three = TINY.replace('[[16, 16, 16], "small"]', "[[16, 16, 16], [16, 16, 32], [32, 16, 16]]")
    db = tmp_path / "b.db"
    events: list[tuple[str, str]] = []
    result: list = []
    progress = lambda event, row: events.append((event, row["job"]))  # noqa: E731
    batch = threading.Thread(
        target=lambda: result.append(run_batch(suite(three), db, jobs=2, progress=progress)))
    batch.start()
    me = psutil.Process()
    victim = None
    deadline = time.time() + 120
    while victim is None and time.time() < deadline and batch.is_alive():
        tasks = [p for p in me.children() if "spawn_main" in " ".join(p.cmdline())]
        victim = tasks[0] if tasks else None
        time.sleep(0.05)
    assert victim is not None
    victim.kill()  # mid-job: its exploration has not finished
    batch.join(timeout=300)
    assert not batch.is_alive()
    rows = result[0].rows
    assert [r["status"] for r in rows] == ["done"] * 3
    assert [e for e, _ in events].count("retry") == 1
    with Database(db) as d:
        statuses = [r["status"] for r in d.runs()]
    assert "running" not in statuses and statuses.count("done") == 3


def test_tasks_are_never_told_where_the_batch_database_is(tiny_batch):
    from eqsched.tools import batch

    db, _, told = tiny_batch
    assert len(told) == 2
    for job, work_dir, driver in told:
        # Its own copy beside the database, in this driver's directory; never the database.
        assert batch.Path(work_dir).parent.parent == tasks_dir(db)
        assert str(db) not in (str(job), driver) and batch.Path(work_dir) != db
    assert len(measured_hashes(db)) == 2 * 3  # with the naive programs: merged by the driver


def test_a_ray_task_whose_worker_dies_is_retried_once(ray_cluster, tmp_path):
    import threading

    import psutil

    events: list[str] = []
    result: list = []
    batch = threading.Thread(target=lambda: result.append(run_batch(
        suite(TINY), tmp_path / "ray.db", executor="ray",
        progress=lambda event, row: events.append(event))))
    batch.start()
    victim = None
    deadline = time.time() + 120
    while victim is None and time.time() < deadline and batch.is_alive():
        for p in psutil.process_iter(["cmdline"]):
            if "ray::_ray_task" in " ".join(p.info["cmdline"] or []):
                victim = p
                break
        time.sleep(0.05)
    assert victim is not None
    victim.kill()
    batch.join(timeout=300)
    assert not batch.is_alive()
    assert [r["status"] for r in result[0].rows] == ["done", "done"]
    assert events.count("retry") == 1
    with Database(tmp_path / "ray.db") as d:
        assert [r["status"] for r in d.runs()] == ["done", "done"]


def test_task_processes_and_their_workers_die_with_a_killed_driver(tmp_path):
    import psutil

    # Jobs that would measure for minutes: a task still alive after the driver died is an orphan.
    (tmp_path / "s.toml").write_text(TINY.replace("trials = 2", "trials = 100000\nseconds = 300")
                                     .replace('[[16, 16, 16], "small"]', "[[32, 32, 32]]"))
    proc = subprocess.Popen([sys.executable, "-m", "eqsched", "batch", "s.toml", "--jobs", "2",
                             "--db", "b.db"], cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    driver = psutil.Process(proc.pid)
    def measuring() -> bool:  # a task exploring: its measuring worker has started
        try:
            return any("_worker_main" in " ".join(p.cmdline())
                       for p in driver.children(recursive=True))
        except psutil.NoSuchProcess:  # one ended while we looked
            return False

    deadline = time.time() + 120
    while not measuring() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert measuring()
    descendants = driver.children(recursive=True)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    gone, alive = psutil.wait_procs(descendants, timeout=20)
    for p in alive:  # cleans up after a failure; the assertion below reports it
        p.kill()
    assert alive == []


def test_what_tasks_stored_before_their_driver_was_killed_is_merged_by_the_next_batch(tmp_path):
    longer = TINY.replace("trials = 2", "trials = 8").replace("batch = 2", "batch = 3")
    (tmp_path / "s.toml").write_text(
        longer.replace('[[16, 16, 16], "small"]', "[[32, 32, 32], [48, 32, 16]]"))
    db = tmp_path / "b.db"
    proc = subprocess.Popen([sys.executable, "-m", "eqsched", "batch", "s.toml", "--jobs", "2",
                             "--db", "b.db"], cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_both_tasks_measured(db, proc)
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # kill -9: nothing merges the tasks' copies
        proc.wait(timeout=30)
    time.sleep(1.0)  # the tasks die with the driver (their parent-death signal)
    left = {r.program_hash for records in task_records(db).values() for r in records}
    assert len(left) >= 4 and measured_hashes(db) == []
    events = []
    result = run_batch(Suite.load(tmp_path / "s.toml"), db, jobs=2,
                       progress=lambda event, data: events.append((event, data)))
    assert events[0] == ("recovered", {"measurements": len(left)})
    assert [r["status"] for r in result.rows] == ["done", "done"]
    after = measured_hashes(db)
    assert left <= set(after) and len(set(after)) == len(after)
    # What the killed batch's tasks measured is not measured again, and nothing is left behind.
    assert sum(r["measured"] for r in result.rows) == len(after) - len(left)
    assert not tasks_dir(db).exists()
    with Database(db) as d:
        assert [r["status"] for r in d.runs()] == ["interrupted"] * 2 + ["done"] * 2


def test_a_task_that_cannot_hand_back_its_rows_says_so_in_one_line(tmp_path, capfd):
    import multiprocessing

    from eqsched.tools import batch

    job = suite(TINY.replace('[[16, 16, 16], "small"]', '[[8, 8, 8]]\nrules = "reorder"')).jobs[0]
    work_dir = tmp_path / "job0-0"
    work_dir.mkdir()  # no snapshot_runs.json: its rows cannot be exported (a full disk, say)
    task = multiprocessing.get_context("spawn").Process(
        target=batch._process_main, args=(job, str(work_dir), os.getpid()))
    task.start()
    task.join(timeout=300)
    assert task.exitcode == 1
    err = capfd.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines() == [
        f"eqsched: error: {job.key}: [Errno 2] No such file or directory: "
        f"'{work_dir / batch.SNAPSHOT_RUNS}'"]


def test_ctrl_c_while_the_tasks_start_up_interrupts_them_without_a_traceback(tmp_path):
    import psutil

    (tmp_path / "s.toml").write_text(TINY.replace("[defaults]", '[defaults]\nrules = "reorder"'))
    proc = subprocess.Popen([sys.executable, "-m", "eqsched", "batch", "s.toml", "--jobs", "2",
                             "--db", "b.db", "--json"], cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    driver = psutil.Process(proc.pid)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not any(
            "spawn_main" in " ".join(p.cmdline()) for p in driver.children()):
        time.sleep(0.01)
    time.sleep(0.3)  # the task is importing (a second or more), with Python's SIGINT handler
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "interrupted" in {row["status"] for row in json.loads(out)["rows"]}


def test_a_batch_that_cannot_write_its_tasks_files_says_so_in_one_line(tmp_path, monkeypatch,
                                                                       capsys):
    import errno

    from eqsched.cli import main
    from eqsched.tools import batch

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "b.db.tasks"))

    monkeypatch.setattr(batch.tempfile, "mkdtemp", full)  # the driver's directory, a full disk
    (tmp_path / "s.toml").write_text(TINY)
    assert main(["batch", str(tmp_path / "s.toml"), "--db", str(tmp_path / "b.db")]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"eqsched: error: cannot write {tmp_path / 'b.db.tasks'} (No space left on device)")
