"""Tasks under one trial budget: the loop's rules (dead tasks dropped, early stopping, an
exhausted space, the budget), the progress table, similar tasks' signature, and real runs over
tiny computations that are no registered workload: measured, stored under their own keys, and
looked up, never measured again, by a re-run."""

import shutil
from dataclasses import replace

import pytest
from conftest import LatencyCurve, small_search

from eqsched.db import Database
from eqsched.default_schedule import default_schedule
from eqsched.egraph.saturate import SaturationError
from eqsched.explore import Settings, TaskTuner, computation_key
from eqsched.expr import relu
from eqsched.task_scheduler import GradientScheduler, RoundRobin, SchedulerError, TaskState
from eqsched.task_tuning import Task, format_table, run_rounds, signature, table, tune_tasks
from eqsched.te import Computation, compute, placeholder, reduce_axis, sum_
from eqsched.workloads import get_workload

MS = 1e-3
# No contention check (it pads every timing to 0.2 s) and no finalists: these tests are about
# the loop; tests/test_explore.py tests what a tuner does.
FAST = Settings(repeats=2, warmup=0, threads=1, contended_cores=None, finalists=0)
# Spaces of millions of programs, saturated in a fraction of a second (the default rules take
# seconds on softmax): what a real run does, sooner.
RULES = ["tile", "vectorize", "parallel"]


def dense(rows: int, cols: int, inner: int, name: str = "dense") -> Computation:
    """relu(X @ W): a task a model's partition would make, built here, registered nowhere."""
    X = placeholder((rows, inner), "X")
    W = placeholder((inner, cols), "W")
    k = reduce_axis(inner, "k")
    Y = compute((rows, cols), lambda i, j: sum_(X[i, k] * W[k, j], axis=k), "Y")
    Z = compute((rows, cols), lambda i, j: relu(Y[i, j]), "Z")
    return Computation(name, [Z])


def states(n):
    return [TaskState(i, f"t{i}", 1.0, 10**7, f"sig{i}") for i in range(n)]


def flat(n):
    return MS


def test_a_task_with_no_valid_program_is_dropped_after_its_slice_saying_why():
    tasks = states(2)
    curves = [LatencyCurve(lambda n: None, failure="wrong result (16 of 16 trials)"),
              LatencyCurve(flat)]
    order, _ = run_rounds(tasks, lambda i: curves[i], GradientScheduler(), 16 * 5)
    assert order == [0, 1, 1, 1, 1]
    assert tasks[0].done == "no valid program: wrong result (16 of 16 trials)"
    assert tasks[0].trials == 16


def test_a_task_that_stops_improving_is_stopped_early():
    tasks = states(2)
    falling = LatencyCurve(lambda n: MS / n)
    curves = [LatencyCurve(flat), falling]
    order, _ = run_rounds(tasks, lambda i: curves[i], RoundRobin(), 16 * 8, early_stopping=32)
    # Its first slice improves on nothing; two more without gain stop it.
    assert tasks[0].trials == 48 and tasks[0].done == "no gain in 32 trials"
    assert tasks[1].trials == 16 * 8 - 48 and tasks[1].done == ""
    assert order == [0, 1, 0, 1, 0, 1, 1, 1]


def test_a_task_whose_space_is_all_measured_is_done():
    tasks = states(2)
    curves = [LatencyCurve(flat, programs=20), LatencyCurve(flat)]
    run_rounds(tasks, lambda i: curves[i], RoundRobin(), 16 * 4, early_stopping=None)
    assert tasks[0].trials == 20 and tasks[0].done == "the space has 20 programs; all measured"
    assert tasks[1].trials == 16 * 4 - 20


def test_a_task_whose_space_cannot_be_built_is_dropped_and_the_others_go_on():
    class Panicking(LatencyCurve):
        def tune(self, trials):
            raise SaturationError("egglog panicked: index out of bounds")

    tasks = states(2)
    curves = [Panicking(flat), LatencyCurve(flat)]
    events = []
    order, _ = run_rounds(tasks, lambda i: curves[i], GradientScheduler(), 48,
                          progress=lambda event, data: events.append(data["task"]))
    assert tasks[0].done == "failed: egglog panicked: index out of bounds"
    assert order == [0, 1, 1, 1] and tasks[1].trials == 48 and events == ["t0", "t1", "t1", "t1"]


def test_the_budget_is_spent_exactly_and_the_last_slice_is_cut():
    tasks = states(3)
    curves = [LatencyCurve(flat) for _ in range(3)]
    order, _ = run_rounds(tasks, lambda i: curves[i], RoundRobin(), 40)
    assert [t.trials for t in tasks] == [16, 16, 8] and order == [0, 1, 2]


def test_a_task_whose_every_trial_fails_is_dropped_with_the_failure_in_its_row(tmp_path,
                                                                             monkeypatch):
    small_search(monkeypatch)
    # Too short a timeout for any compile: the default schedule and the search's program fail.
    result = tune_tasks([Task("dense", dense(4, 8, 16))], 2, slice_trials=2,
                        db=tmp_path / "x.db", cost_model="random", rules=RULES,
                        settings=replace(FAST, timeout_s=0.01))
    (row,) = result.tasks
    assert row["latency_s"] is None and row["trials"] == 2
    assert row["done"] == "no valid program: timed out after 0.01 s (2 of 2 trials)"
    assert row["done"] in format_table(result.tasks)


def test_a_scheduler_that_picks_a_task_that_is_done_is_refused():
    class Stubborn(RoundRobin):
        def next_task(self, tasks):
            return 0

    tasks = states(2)
    curves = [LatencyCurve(lambda n: None), LatencyCurve(flat)]
    with pytest.raises(SchedulerError, match="chose task 0, which is not a task left to tune"):
        run_rounds(tasks, lambda i: curves[i], Stubborn(), 64)


def test_an_interrupt_ends_the_rounds_with_what_they_did():
    tasks = states(2)
    curves = [LatencyCurve(flat), LatencyCurve(flat)]

    def stop_after_two(event, data):
        if data["round"] == 1:
            raise KeyboardInterrupt

    order, interrupted = run_rounds(tasks, lambda i: curves[i], RoundRobin(), 160,
                                    progress=stop_after_two)
    assert interrupted and order == [0, 1] and [t.trials for t in tasks] == [16, 16]


def test_the_table_has_one_row_per_task_and_a_total():
    tasks = states(2)
    tasks[0].trials, tasks[0].history = 32, [2 * MS, MS]
    tasks[1].weight, tasks[1].done = 3.0, "no valid program"
    rows = table(tasks)
    assert rows[0] == {"id": 0, "name": "t0", "flops": 10**7, "weight": 1.0, "best_gflops": 10.0,
                       "latency_s": MS, "weighted_latency_s": MS, "trials": 32, "done": ""}
    assert rows[1]["latency_s"] is None and rows[1]["done"] == "no valid program"
    text = format_table(rows).splitlines()
    assert text[0].split(" | ")[0].strip() == "ID" and "Weighted (us)" in text[0]
    assert "1000.00" in text[2] and text[-1] == "Total trials: 32; total weighted latency: - us"


def test_similar_tasks_are_one_computation_at_other_shapes():
    assert signature(dense(4, 8, 16)) == signature(dense(32, 8, 64, name="layer2"))
    assert signature(dense(4, 8, 16)) != signature(get_workload("matmul").build(4, 8, 16))
    assert signature(get_workload("softmax").build(4, 32)) \
        == signature(get_workload("softmax").build(128, 768))


def test_a_task_needs_a_name_and_a_positive_weight_and_bad_settings_open_no_database(tmp_path):
    with pytest.raises(ValueError, match="weight must be more than 0"):
        Task("dense", dense(4, 8, 16), weight=0)
    with pytest.raises(ValueError, match="no tasks"):
        tune_tasks([], 16)
    for bad in ({"population": 1}, {"seed": -1}, {"scheduler": "fastest"}):
        with pytest.raises(ValueError):
            tune_tasks([Task("dense", dense(4, 8, 16))], 16, db=tmp_path / "x.db", **bad)
    assert not (tmp_path / "x.db").exists()


def test_two_computations_of_one_name_are_kept_apart():
    a, b = dense(4, 8, 16, name="task"), dense(4, 8, 8, name="task")
    assert computation_key(a)[0].startswith("task@") and computation_key(a) != computation_key(b)
    assert computation_key(a) == computation_key(dense(4, 8, 16, name="task"))


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A gradient run over three tiny tasks (one registered nowhere), 16 trials in slices of 4:
    its database, the tasks and the result, which several tests read."""
    db = tmp_path_factory.mktemp("tuned") / "x.db"
    tasks = [Task("matmul", get_workload("matmul").build(16, 16, 16), weight=2),
             Task("softmax", get_workload("softmax").build(4, 32)),
             Task("dense", dense(4, 8, 16))]
    with pytest.MonkeyPatch.context() as monkeypatch:
        small_search(monkeypatch)
        events = []
        result = tune_tasks(tasks, 16, slice_trials=4, db=db, cost_model="random",
                            rules=RULES, settings=FAST,
                            progress=lambda event, data: events.append((event, data)))
    return db, tasks, result, events


def test_a_run_tunes_every_task_and_stores_them_under_their_own_keys(tuned):
    db, tasks, result, _ = tuned
    assert result.trials == 16 == result.measured and result.order[:3] == [0, 1, 2]
    assert [r["trials"] for r in result.tasks] == [len(r.trials) for r in result.results]
    assert all(r["latency_s"] and r["best_gflops"] for r in result.tasks)
    assert result.objective_s == pytest.approx(sum(r["weight"] * r["latency_s"]
                                                   for r in result.tasks))
    with Database(db) as d:
        for task, row, explored in zip(tasks, result.tasks, result.results):
            workload, size = computation_key(task.computation)
            assert explored.workload == workload
            assert len(d.records(workload, size)) == row["trials"]
            assert d.runs(workload, size)[0]["status"] == "done"
            assert explored.best.correct  # checked against numpy in the worker


def test_each_task_s_first_trial_is_its_default_schedule_and_the_best_is_no_slower(tuned):
    _, tasks, result, _ = tuned
    lanes = FAST.options().target.vector_lanes
    for task, explored in zip(tasks, result.results):
        default = default_schedule(task.computation, lanes).program
        first, *searched = explored.trials
        assert first.round == 0 and first.structure == "default" and first.correct
        assert first.program_hash == default.hash() not in {t.program_hash for t in searched}
        # No finalists in FAST: the best is the fastest correct trial, the default among them.
        fastest = min((t for t in explored.trials if t.correct), key=lambda t: t.median_s)
        assert explored.best.median_s == fastest.median_s <= first.median_s


def test_the_table_is_reported_after_every_slice(tuned):
    _, tasks, result, events = tuned
    tables = [data for event, data in events if event == "tasks"]
    assert [t["task"] for t in tables] == [tasks[i].name for i in result.order]
    assert [t["trials"] for t in tables][-1] == 16
    assert tables[-1]["table"].splitlines()[-1].startswith("Total trials: 16;")
    rounds = [data for event, data in events if event == "round"]
    assert {r["task"] for r in rounds} == {"matmul", "softmax", "dense"}


def test_a_rerun_on_the_same_database_measures_nothing_new(tuned, tmp_path, monkeypatch):
    db, tasks, first, _ = tuned
    copy = tmp_path / "x.db"
    shutil.copy(db, copy)
    small_search(monkeypatch)
    again = tune_tasks(tasks, 16, slice_trials=4, db=copy, cost_model="random", rules=RULES,
                       settings=FAST)
    assert again.measured == 0
    assert again.order == first.order and again.tasks == first.tasks


def test_an_interrupted_run_stores_every_task_interrupted_and_resumes(tmp_path, monkeypatch):
    small_search(monkeypatch)
    db = tmp_path / "x.db"
    tasks = [Task("dense", dense(4, 8, 16)), Task("softmax", get_workload("softmax").build(4, 32))]

    def stop_after_the_first_slice(event, data):
        if event == "tasks":
            raise KeyboardInterrupt

    def tune(**kw):
        return tune_tasks(tasks, 8, slice_trials=4, db=db, cost_model="random", rules=RULES,
                          settings=FAST, **kw)

    cut = tune(progress=stop_after_the_first_slice)
    assert cut.interrupted and cut.order == [0] and cut.results[1] is None
    assert [row["trials"] for row in cut.tasks] == [4, 0]
    with Database(db) as d:
        assert d.runs(*computation_key(tasks[0].computation))[0]["status"] == "interrupted"
    resumed = tune()
    assert not resumed.interrupted and resumed.measured == 4  # the first slice is looked up
    assert [len(r.trials) for r in resumed.results] == [4, 4]


def test_a_task_s_learned_model_starts_from_the_stored_measurements_of_the_model_s_tasks(
        tuned, tmp_path):
    # Tasks are stored under keys no registry rebuilds (name@hash): a tuner learns from those
    # of its own computation and of the related ones it is given, as `tune_tasks` gives each
    # task its siblings.
    db, tasks, _, _ = tuned
    copy = tmp_path / "x.db"
    shutil.copy(db, copy)
    with Database(copy) as d:
        correct = [sum(r.correct for r in d.records(*computation_key(t.computation)))
                   for t in tasks]

    def stored(task, related):
        events = []
        TaskTuner(task.computation, db=copy, cost_model="learned", rules=RULES, settings=FAST,
                  related=related, progress=lambda event, data: events.append((event, data))
                  ).close()
        return dict(events)["learning"]["stored"]

    assert stored(tasks[2], []) == correct[2] > 0
    assert stored(tasks[2], [t.computation for t in tasks[:2]]) == sum(correct)
