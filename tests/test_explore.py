"""The exploration loop: measured, checked, stored, resumable, reproducible."""

import dataclasses
import gc
import json
import math
import shutil
import weakref

import pytest
from conftest import small_search

import eqsched.explore as explore_module
from eqsched.backend import CompileOptions, Target, TargetError, compile_program
from eqsched.backend import target as target_module
from eqsched.db import Database, DatabaseError
from eqsched.default_schedule import default_schedule
from eqsched.explore import (
    ExploreError,
    Settings,
    TaskTuner,
    check_seconds,
    computation_key,
    explore,
)
from eqsched.extract.learned import LearnedModel
from eqsched.ir import naive_program
from eqsched.machine_model import machine_model
from eqsched.schedule import Schedule
from eqsched.te import Computation, compute, placeholder, reduce_axis, sum_
from eqsched.workloads import get_workload

SIZE = (16, 32, 8)
# No contention check: these tests are about the loop, and a check pads every timing to
# runner.LOAD_WINDOW_S (tests/test_trials.py and tests/test_runner.py test it).
FAST = Settings(repeats=2, warmup=0, threads=1, contended_cores=None)


@pytest.fixture(autouse=True)
def every_search_small(monkeypatch):
    small_search(monkeypatch)  # these tests are about the loop around the search


def run(db, **kw):
    kw.setdefault("trials", 8)
    kw.setdefault("batch", 4)
    kw.setdefault("settings", FAST)
    return explore("matmul", SIZE, db=db, seed=0, cost_model="random", measure_naive=False,
                   **kw)


@pytest.fixture(scope="module")
def explored(tmp_path_factory):
    """One run of 8 trials (two rounds), which several tests read: its database and result."""
    db = tmp_path_factory.mktemp("explored") / "x.db"
    with pytest.MonkeyPatch.context() as monkeypatch:
        small_search(monkeypatch)
        return db, run(db)


def test_an_exploration_measures_checks_and_stores_every_trial(explored):
    db, result = explored
    assert len(result.trials) == 8 and result.measured == 8 and len(result.rounds) == 2
    assert result.best is not None and result.best.correct
    assert result.stop_reason == "the trial budget (8) is spent"
    # A workload's exploration measures what its space holds, no default schedule first.
    assert all(t.structure != "default" for t in result.trials)
    with Database(db) as d:
        records = d.records("matmul", SIZE)
        # Programs with parallel loops are keyed with the thread count they were timed with.
        stored = {r.program_hash.split("/threads=")[0] for r in records}
        assert stored == {t.program_hash for t in result.trials}
        assert all(r.correct or r.error for r in records)
        (run_row,) = d.runs("matmul", SIZE)
        assert run_row["status"] == "done" and run_row["seed"] == 0
        # batch compares the recorded budget to skip a job already done
        assert run_row["budget"] == {"trials": 8, "seconds": None, "batch": 4, "population": 192}
        # What a report needs without re-running anything: the space and the best's standing.
        summary = run_row["summary"]
        assert summary["space"]["programs"] == result.space["programs"] > 1
        assert summary["best_gflops"] == result.best.gflops and summary["peak_gflops"] > 0


def test_the_best_is_the_fastest_finalist_timed_again_side_by_side(explored, tmp_path):
    db, result = explored
    good = sorted((t for t in result.trials if t.correct), key=lambda t: t.median_s)
    assert result.in_run_best_gflops == good[0].gflops
    finalists = result.finalists
    assert [f["hash"] for f in finalists] == [t.program_hash for t in good[:FAST.finalists]]
    assert [f["error"] for f in finalists] == [None] * len(finalists)  # all correct
    fastest = max(finalists, key=lambda f: f["remeasured_gflops"])
    assert result.best.program_hash == fastest["hash"] == result.best_program.hash()
    assert result.best.gflops == fastest["remeasured_gflops"]
    with Database(db) as d:
        (run_row,) = d.runs("matmul", SIZE)
        assert run_row["summary"]["finalists"] == finalists
        assert run_row["summary"]["best_gflops"] == result.best.gflops
    alone = run(tmp_path / "y.db", settings=dataclasses.replace(FAST, finalists=0))
    assert alone.finalists == [] and alone.in_run_best_gflops is None
    assert alone.best.median_s == min(t.median_s for t in alone.trials if t.correct)


def test_the_best_trace_replays_to_the_best_program(explored):
    _, result = explored
    naive = naive_program(get_workload("matmul").build(*SIZE))
    replayed = Schedule.replay(naive, result.best_trace).program
    assert replayed.hash() == result.best_program.hash() == result.best.program_hash


def test_a_rerun_with_the_same_seed_and_database_measures_nothing_new(explored, tmp_path):
    db = tmp_path / "x.db"
    shutil.copy(explored[0], db)
    first = explored[1]
    again = run(db)
    assert again.measured == 0
    assert [t.program_hash for t in again.trials] == [t.program_hash for t in first.trials]
    # The same finalists; which wins their fresh side-by-side timing is the machine's noise
    # when they run within a few percent of each other.
    assert [f["hash"] for f in again.finalists] == [f["hash"] for f in first.finalists]


def row_scale(rows: int, cols: int) -> Computation:
    """Y[i, j] = X[i, j] * sum(X[i, :]): a computation made here, registered as no workload."""
    X = placeholder((rows, cols), "X")
    c = reduce_axis(cols, "c")
    S = compute((rows,), lambda i: sum_(X[i, c], axis=c), "S")
    Y = compute((rows, cols), lambda i, j: X[i, j] * S[i], "Y")
    return Computation("row_scale", [Y])


def test_a_tuner_stepped_in_slices_saturates_once_and_a_rerun_measures_nothing(tmp_path):
    db = tmp_path / "x.db"

    def tune_in_slices():
        events = []
        tuner = TaskTuner(row_scale(8, 32), db=db, cost_model="random", batch=4, settings=FAST,
                          rules=["tile", "vectorize", "parallel"], measure_naive=False,
                          progress=lambda event, data: events.append(event))
        slices = [tuner.tune(4), tuner.tune(4)]
        return tuner.close(), slices, events

    result, slices, events = tune_in_slices()
    assert events.count("saturating") == 1 and len(result.rounds) == 2
    assert slices[1] <= slices[0] and result.best.correct  # checked in the worker against numpy
    key = computation_key(row_scale(8, 32))
    assert (result.workload, result.size) == (key[0], list(key[1]))
    with Database(db) as d:
        assert len(d.records(*key)) == result.measured == 8
        (run_row,) = d.runs(*key)
        assert run_row["status"] == "done"
        assert run_row["budget"]["trials"] is None  # decided slice by slice
    again, _, _ = tune_in_slices()
    assert again.measured == 0
    assert [t.program_hash for t in again.trials] == [t.program_hash for t in result.trials]


def test_a_tuner_stepped_with_search_ahead_proposes_what_one_call_proposes(tmp_path):
    db = tmp_path / "x.db"
    matmul = get_workload("matmul").build(*SIZE)

    def tuner(search_ahead: bool) -> TaskTuner:
        return TaskTuner(matmul, key=("matmul", list(SIZE)), db=db, cost_model="random",
                         batch=4, settings=FAST, measure_naive=False, search_ahead=search_ahead)

    def hashes(result) -> list[str]:
        return [t.program_hash for t in result.trials]

    one = tuner(search_ahead=False)
    one.tune(12)
    whole = one.close()
    ahead = tuner(search_ahead=True)
    for _ in range(3):
        ahead.tune(4)
    stepped = ahead.close()
    assert stepped.measured == 0 and hashes(stepped) == hashes(whole)
    # Without it, a slice's first round is searched after the last round was learned from.
    alone = tuner(search_ahead=False)
    for _ in range(3):
        alone.tune(4)
    assert hashes(alone.close()) != hashes(whole)


def test_a_tuner_asked_for_the_default_schedule_measures_it_first_within_its_budget(tmp_path):
    comp, db = row_scale(8, 32), tmp_path / "x.db"
    default = default_schedule(comp, FAST.options().target.vector_lanes)
    # Every correct trial is a finalist: the default is timed again beside the search's best.
    settings = dataclasses.replace(FAST, finalists=8, final_rounds=1)

    def tuner():
        return TaskTuner(comp, db=db, cost_model="random", batch=4, settings=settings,
                         rules=["tile", "vectorize", "parallel"], measure_naive=False,
                         measure_default=True)

    first = tuner()
    first.tune(1)  # the budget's one trial is the default schedule
    assert [len(r.trials) for r in first.result.rounds] == [1]
    (trial,) = first.result.trials
    assert trial.round == 0 and trial.structure == "default" and trial.correct
    assert trial.program_hash == default.program.hash()
    first.tune(4)
    result = first.close()
    assert [len(r.trials) for r in result.rounds] == [1, 4]
    assert default.program.hash() not in {t.program_hash for t in result.trials[1:]}
    finalists = {f["hash"]: f["remeasured_gflops"] for f in result.finalists}
    assert default.program.hash() in finalists
    assert result.best.gflops >= finalists[default.program.hash()]
    with Database(db) as d:  # stored with the trace that rebuilds it, as any trial
        (record,) = [r for r in d.records(*computation_key(comp))
                     if r.program_hash == default.program.hash()]
        assert record.structure == "default" and record.trace == default.trace
    again = tuner()
    again.tune(5)
    assert again.close().measured == 0


class SearchBuilt(Exception):
    """Raised in place of building a run's search: the test has seen what it was given."""


@pytest.mark.parametrize("threads", [1, 2])
def test_the_first_round_settles_at_a_share_of_the_calibrated_peak_of_its_cores(
        tmp_path, monkeypatch, threads):
    # The first round evolves more islands until its best is predicted at a share of the peak
    # of the cores the program may use: the target's calibrated one, the same on every run (a
    # peak measured in each run moved with the load, and batch workers then proposed different
    # programs for one seed). At one core's peak a two-thread run settled on its first island.
    def build_search(space, model, **options):
        raise SearchBuilt(options["settled_s"])

    monkeypatch.setattr(explore_module, "EvolutionarySearch", build_search)
    with Database(tmp_path / "x.db") as db, pytest.raises(SearchBuilt) as built:
        explore("matmul", SIZE, db=db, cost_model="analytic",
                settings=dataclasses.replace(FAST, threads=threads))
    flops = naive_program(get_workload("matmul").build(*SIZE)).computation.flops
    assert built.value.args[0] == flops / (explore_module.SETTLED_SHARE * threads
                                           * machine_model().peak_gflops * 1e9)


def test_an_interrupt_in_the_middle_of_a_round_keeps_its_finished_trials(tmp_path, monkeypatch):
    import eqsched.trials as trials_module

    calls = []

    def measure_then_interrupt(*args, **kwargs):
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return real_measure(*args, **kwargs)

    real_measure = trials_module.measure
    monkeypatch.setattr(trials_module, "measure", measure_then_interrupt)
    cut = run(tmp_path / "x.db")
    assert cut.interrupted
    assert [len(r.trials) for r in cut.rounds] == [4, 1]  # the second round stopped in its 2nd
    assert cut.rounds[1].spearman is None


def test_an_interrupted_run_keeps_its_measurements_and_resumes(tmp_path):
    db = tmp_path / "x.db"

    def stop_after_first_round(event, data):
        if event == "round":
            raise KeyboardInterrupt

    cut = run(db, progress=stop_after_first_round)
    assert cut.interrupted and len(cut.trials) == 4 and cut.stop_reason == "interrupted"
    with Database(db) as d:
        assert len(d.records("matmul", SIZE)) == 4
        assert d.runs("matmul", SIZE)[0]["status"] == "interrupted"
    resumed = run(db)
    assert resumed.measured == 4 and len(resumed.trials) == 8
    assert all(t.cached for t in resumed.trials[:4])


def test_a_space_smaller_than_the_budget_ends_early_and_says_so(tmp_path, within):
    events = []
    db = tmp_path / "x.db"
    with within(300):
        # Inlining and a parallel outer loop split nothing: a space of a few programs.
        result = explore("elementwise_chain", (31,), trials=64, batch=8, db=db, seed=0,
                         rules=["inline", "parallel"], cost_model="random", settings=FAST,
                         measure_naive=False, progress=lambda event, data: events.append(event))
    programs = result.space["programs"]
    assert 1 < programs < 64 and len(result.trials) == programs
    assert len({t.program_hash for t in result.trials}) == programs
    assert result.stop_reason == f"the space has {programs} programs; all measured"
    assert events[-2:] == ["exhausted", "finalists"]
    with Database(db) as d:
        (run_row,) = d.runs("elementwise_chain", (31,))
        assert run_row["status"] == "done"
        assert run_row["summary"]["stop_reason"] == result.stop_reason


def test_a_round_searched_while_the_time_ran_out_is_not_measured(tmp_path, monkeypatch):
    import eqsched.explore as explore_module

    monkeypatch.setattr("os.cpu_count", lambda: 4)  # round 1 is searched while 0 is measured
    rounds_done = []

    def count_rounds(event, data):
        if event == "round":
            rounds_done.append(data["round"])

    # The clock runs out as round 0 ends, after round 1 was searched.
    monkeypatch.setattr(explore_module._Budget, "out_of_time", lambda budget: bool(rounds_done))
    result = run(tmp_path / "x.db", seconds=3600, progress=count_rounds)
    assert [len(r.trials) for r in result.rounds] == [4]
    assert result.stop_reason == "the time budget (3600 s) is spent"


def test_rank_correlation_is_reported_per_round(explored):
    _, result = explored
    out = result.to_json()
    assert [r["round"] for r in out["rounds"]] == [0, 1]
    for r in out["rounds"]:
        assert r["spearman"] is None or -1 <= r["spearman"] <= 1
    json.dumps(out)  # JSON-able throughout


def test_a_wrong_program_is_never_the_best(tmp_path, monkeypatch):
    import eqsched.trials as trials_module

    real = trials_module.measure

    def every_other_wrong(prog, **kw):
        m = real(prog, **kw)
        if int(prog.hash(), 16) % 2:
            m.correct, m.check_message = False, "forced wrong by the test"
        return m

    monkeypatch.setattr(trials_module, "measure", every_other_wrong)
    result = run(tmp_path / "x.db")
    wrong = [t for t in result.trials if t.correct is False]
    assert wrong and all("wrong result" in t.error for t in wrong)
    if result.best is not None:
        assert result.best.correct and int(result.best.program_hash, 16) % 2 == 0


def test_a_space_dropped_before_a_run_is_freed_on_the_thread_that_made_it(tmp_path,
                                                                        monkeypatch):
    # Its e-graph sits in a reference cycle: only the cyclic collector frees it, on whatever
    # thread runs it, and egglog's e-graph must be dropped on the thread that made it.
    from eqsched.egraph.space import build_space
    from eqsched.rules import default_rules

    freed = []
    measure_round = explore_module._Exploration.measure_round

    def measure_and_look(self, *args, **kwargs):
        freed.append(egraph() is None)
        return measure_round(self, *args, **kwargs)

    monkeypatch.setattr(explore_module._Exploration, "measure_round", measure_and_look)
    gc.disable()  # as if the collector had not run yet
    try:
        earlier = build_space(naive_program(get_workload("matmul").build(*SIZE)),
                              default_rules())
        egraph = weakref.ref(earlier.saturation.egraph)
        del earlier
        run(tmp_path / "x.db", trials=4)
    finally:
        gc.enable()
    assert freed and all(freed)


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="trials"):
        explore("matmul", SIZE, trials=0)
    for seconds in (0, -1, math.nan, math.inf):
        with pytest.raises(ValueError, match="seconds must be more than 0 and finite"):
            explore("matmul", SIZE, seconds=seconds, db=tmp_path / "x.db")
    with pytest.raises(ValueError, match="seed must be from 0"):
        explore("matmul", SIZE, seed=-1, db=tmp_path / "x.db")
    for population in (1, 2.5, True):
        with pytest.raises(ValueError, match="population must be a whole number of at least 2"):
            explore("matmul", SIZE, population=population, db=tmp_path / "x.db")
    assert not (tmp_path / "x.db").exists()  # refused before the database was opened
    assert check_seconds(2) == 2.0


AVX2 = "host,-avx512f"


def test_another_target_measures_everything_again_and_the_same_target_reuses(tmp_path):
    db = tmp_path / "x.db"
    run(db, trials=4)
    avx2 = run(db, trials=4, target=AVX2)
    assert avx2.target == AVX2 and avx2.measured == len(avx2.trials) == 4
    assert run(db, trials=4, target=AVX2).measured == 0
    with Database(db) as d:
        assert len(d.records("matmul", SIZE)) == len(d.records("matmul", SIZE, target=AVX2)) == 4
        assert [r["config"]["target"] for r in d.runs()] == ["host", AVX2, AVX2]
    best = compile_program(avx2.best_program, CompileOptions(target=Target.parse(AVX2)))
    assert "zmm" not in best.asm()


def test_a_target_is_refused_before_anything_is_saturated(tmp_path, monkeypatch):
    def no_saturating(*args, **kwargs):
        raise AssertionError("saturated, though the target was refused")

    monkeypatch.setattr(explore_module, "saturate", no_saturating)
    with pytest.raises(TargetError, match="LLVM knows no x86 CPU"):
        run(tmp_path / "x.db", target="nosuchcpu")
    no_avx512 = {**target_module._host_feature_map(), "avx512f": False}
    monkeypatch.setattr(target_module, "_host_feature_map", lambda: no_avx512)
    with pytest.raises(TargetError, match="needs avx512f, which this CPU"):
        run(tmp_path / "x.db", target="skylake-avx512")


def test_a_run_that_fails_is_marked_failed_and_keeps_its_measurements(tmp_path):
    db = tmp_path / "x.db"

    def fail_in_second_round(event, data):
        if event == "round" and data["round"] == 1:
            raise RuntimeError("a bug in the caller's progress hook")

    with pytest.raises(RuntimeError, match="progress hook"):
        run(db, progress=fail_in_second_round)
    with Database(db) as d:
        assert d.runs("matmul", SIZE)[0]["status"] == "failed"
        assert len(d.records("matmul", SIZE)) == 8


class FillingDisk(Database):
    """A database whose disk is full after `room` measurements: stores and the run's status
    fail as SQLite's do then."""

    room = 2

    def add(self, record):
        if self.room == 0:
            raise DatabaseError(f"{self.path}: add failed (database or disk is full)")
        self.room -= 1
        return super().add(record)

    def finish_run(self, run_id, **kwargs):
        if self.room == 0:
            raise DatabaseError(f"{self.path}: finish_run failed (database or disk is full)")
        return super().finish_run(run_id, **kwargs)


def test_a_store_that_fails_is_the_error_reported_and_what_was_stored_stays(tmp_path):
    with FillingDisk(tmp_path / "x.db") as db:
        with pytest.raises(DatabaseError, match="add failed"):  # not the status it could not set
            run(db)
        assert len(db.records("matmul", SIZE)) == 2
        assert db.runs()[0]["status"] == "running"  # shown abandoned once this process is gone


def test_the_learned_model_starts_from_the_databases_measurements(tmp_path):
    db = tmp_path / "x.db"
    run(db, trials=4)  # measured with the random model: stored programs of this machine
    with Database(db) as d:
        stored = sum(1 for r in d.records() if r.correct)
    events = []
    explore("matmul", SIZE, db=db, seed=0, cost_model="learned", settings=FAST, trials=4,
            batch=4, measure_naive=False, progress=lambda event, data: events.append(
                (event, data)))
    assert stored > 0 and ("learning", {"stored": stored, "as_run": None}) in events


def test_a_learned_run_run_again_starts_from_what_the_first_started_from_and_measures_nothing(
        tmp_path):
    # Trees from 8 measurements on: the second attempt would rank its first round with trees
    # trained on the first attempt's 16, and propose other programs, if it learned from them.
    db = tmp_path / "x.db"

    def attempt(trials=16, seed=0):
        events = []
        result = explore("matmul", SIZE, db=db, seed=seed, trials=trials, batch=4,
                         cost_model=LearnedModel(min_samples=10), settings=FAST,
                         measure_naive=False, progress=lambda event, data: events.append(
                             (event, data)))
        return result, dict(events)["learning"]

    first, learning = attempt()
    assert learning == {"stored": 0, "as_run": None}
    again, learning = attempt()
    assert learning == {"stored": 0, "as_run": first.run_id}
    assert again.measured == 0
    assert [t.program_hash for t in again.trials] == [t.program_hash for t in first.trials]
    with Database(db) as d:
        runs = {run["id"]: run for run in d.runs()}
    assert runs[again.run_id]["learned_from"] == runs[first.run_id]["learned_from"]
    other, learning = attempt(seed=1)  # other settings: it learns from every measurement
    assert learning == {"stored": first.measured, "as_run": None}


def test_a_run_that_timed_out_everything_is_measured_again_and_finds_the_best(tmp_path):
    db = tmp_path / "x.db"
    hasty = explore("matmul", SIZE, db=db, seed=0, cost_model="random", trials=4, batch=4,
                    settings=Settings(repeats=2, warmup=0, threads=1, timeout_s=1e-4))
    assert hasty.best is None and all(t.error.startswith("timed out") for t in hasty.trials)
    with Database(db) as d:
        assert {r.error_kind for r in d.records()} == {"transient"}
    patient = run(db, trials=4)  # the same candidates, with the usual timeout
    assert [t.program_hash for t in patient.trials] == [t.program_hash for t in hasty.trials]
    assert patient.measured == 4 and patient.best is not None and patient.best.correct


def test_other_measurement_settings_measure_again(tmp_path):
    db = tmp_path / "x.db"
    run(db, trials=4)
    assert run(db, trials=4).measured == 0
    other_inputs = Settings(repeats=2, warmup=0, threads=1, input_seed=1)
    assert run(db, trials=4, settings=other_inputs).measured == 4


def egglog_panic():
    """Make egglog panic for real: an e-graph used by a thread other than the one that built
    it (this one, which also drops it: dropped elsewhere, egglog would complain again)."""
    import threading

    from egglog import EGraph, i64

    egraph, raised = EGraph(), []

    def use():
        try:
            egraph.extract(i64(1))
        except BaseException as err:  # the panic, a BaseException
            raised.append(err)

    thread = threading.Thread(target=use)
    thread.start()
    thread.join()
    raise raised[0]


def test_an_egglog_panic_fails_the_run_in_one_line(tmp_path, monkeypatch):
    import eqsched.egraph.saturate as saturate_module
    from eqsched.egraph.saturate import SaturationError

    monkeypatch.setattr(saturate_module, "_saturate", lambda *args: egglog_panic())
    with pytest.raises(SaturationError, match="egglog panicked while saturating matmul: ") as e:
        run(tmp_path / "x.db")
    assert "\n" not in str(e.value)
    with Database(tmp_path / "x.db") as d:
        (failed,) = d.runs()
        assert failed["status"] == "failed"  # not done: batch runs it again
        assert failed["summary"]["stop_reason"].startswith("failed: SaturationError: egglog")


def test_a_best_whose_trace_rebuilds_another_program_is_not_reported(tmp_path, monkeypatch):
    from eqsched.extract.search import Candidate

    derived = Candidate.trace

    def wrong_trace(cand):
        # The candidate's trace without its last step (or with one more): another program.
        steps = derived.__get__(cand)
        return steps[:-1] or [{"op": "split", "args": {"loop": "C.i", "factors": [-1, 2]}}]

    monkeypatch.setattr(Candidate, "trace", property(wrong_trace))
    with pytest.raises(ExploreError, match="trace rebuilds program .*, not the measured"):
        run(tmp_path / "x.db", trials=4)
    with Database(tmp_path / "x.db") as d:
        assert d.runs()[0]["status"] == "failed"


def test_a_best_whose_trace_rebuilds_another_program_gives_way_to_the_next(tmp_path,
                                                                         monkeypatch):
    checked = []
    real = explore_module._check_trace

    def first_checked_fails(naive, trace, measured_hash):  # the best: as if derive had erred
        checked.append(measured_hash)
        if len(checked) == 1:
            raise explore_module.ExploreError("the best program's trace rebuilds another")
        real(naive, trace, measured_hash)

    monkeypatch.setattr(explore_module, "_check_trace", first_checked_fails)
    result = run(tmp_path / "x.db", trials=8)
    assert result.unreplayable == checked[:1] and result.best.program_hash == checked[1]
    naive = naive_program(get_workload("matmul").build(*SIZE))
    assert Schedule.replay(naive, result.best_trace).program.hash() == result.best.program_hash
