"""Measuring one candidate: looked up or measured and stored at once, its trace with it; the key it
is stored under; the gate that holds the search while a candidate is timed."""

import dataclasses
import math
import threading
import time

import pytest

import eqsched.trials as trials_module
from eqsched.backend import TargetError, codegen
from eqsched.db import Database
from eqsched.egraph.derive import DeriveError
from eqsched.egraph.space import build_space
from eqsched.extract import EvolutionarySearch, get_cost_model
from eqsched.ir import naive_program
from eqsched.rules import default_rules
from eqsched.runner import Measurement, measure
from eqsched.schedule import Schedule
from eqsched.trials import MAX_SEED, Measurer, Settings, TimingGate, check_seed, measurement_key
from eqsched.workloads import get_workload

SIZE = [16, 32, 8]
FAST = Settings(repeats=2, warmup=0, threads=1)


@pytest.fixture(scope="module")
def naive():
    return naive_program(get_workload("matmul").build(*SIZE))


@pytest.fixture(scope="module")
def candidate(naive):
    space = build_space(naive, default_rules())
    return EvolutionarySearch(space, get_cost_model("random"), seed=3).random_candidate()


@pytest.fixture
def db(tmp_path):
    with Database(tmp_path / "x.db") as db:
        yield db


def measurer(db, naive, run_id=None):
    return Measurer(db, "matmul", SIZE, naive, FAST, run_id, TimingGate())


def no_measuring(*args, **kwargs):
    raise AssertionError("measured, though it should not have been")


def test_a_candidate_is_measured_and_stored_with_its_trace(db, naive, candidate):
    trial = measurer(db, naive).trial(candidate, 1e-3, round_index=2)
    assert not trial.cached and trial.correct and trial.median_s > 0 and trial.round == 2
    (record,) = db.records("matmul", SIZE)
    assert record.program_hash == measurement_key(candidate.program, FAST)
    assert record.median_s == trial.median_s and record.predicted_s == 1e-3
    assert record.others_cores >= 0 and record.load >= 0  # the machine while it was timed
    assert Schedule.replay(naive, record.trace).program.hash() == candidate.hash


def test_a_stored_measurement_is_looked_up_not_measured_again(db, naive, candidate,
                                                              monkeypatch):
    first = measurer(db, naive).trial(candidate, 1e-3, round_index=0)
    monkeypatch.setattr(trials_module, "measure", no_measuring)
    again = measurer(db, naive).trial(candidate, 2e-3, round_index=1)
    assert again.cached and not first.cached
    assert (again.median_s, again.gflops, again.correct) == (
        first.median_s, first.gflops, first.correct)
    assert again.predicted_s == 2e-3 and again.round == 1
    assert len(db.records("matmul", SIZE)) == 1


def test_a_measurement_is_stored_and_looked_up_under_its_target(db, naive, candidate,
                                                                 monkeypatch):
    host = measurer(db, naive).trial(candidate, 1e-3, round_index=0)
    avx2 = Settings(repeats=2, warmup=0, threads=1, target="host, -avx512f")
    assert avx2.target == "host,-avx512f"  # normalized: the name it is stored under
    other = Measurer(db, "matmul", SIZE, naive, avx2, None, TimingGate())
    first = other.trial(candidate, 1e-3, round_index=0)
    assert not host.cached and not first.cached  # the host's record does not answer for AVX2
    assert [r.target for r in db.records("matmul", SIZE, target=None)] == ["host",
                                                                           "host,-avx512f"]
    monkeypatch.setattr(trials_module, "measure", no_measuring)
    assert other.trial(candidate, 1e-3, round_index=1).cached  # the same target again



def test_a_timing_of_another_code_generator_is_measured_again(db, naive, candidate,
                                                               monkeypatch):
    old = measurer(db, naive).trial(candidate, 1e-3, round_index=0)
    # A newer backend compiles the same program to other code: its timing is its own.
    monkeypatch.setattr(trials_module, "codegen", lambda: "next/llvm-99")
    new = measurer(db, naive).trial(candidate, 1e-3, round_index=1)
    assert not old.cached and not new.cached
    assert [r.settings["codegen"] for r in db.records("matmul", SIZE)] == [
        codegen(), "next/llvm-99"]
    monkeypatch.setattr(trials_module, "measure", no_measuring)
    assert measurer(db, naive).trial(candidate, 1e-3, round_index=2).cached

def test_an_unknown_target_is_refused_by_the_settings():
    with pytest.raises(TargetError, match="LLVM knows no x86 CPU"):
        Settings(target="nosuchcpu")


def test_a_timeout_or_memory_cap_the_worker_cannot_use_is_refused_by_the_settings():
    for bad in (math.inf, math.nan, 0, -5):
        with pytest.raises(ValueError, match="timeout must be"):
            Settings(timeout_s=bad)
    with pytest.raises(ValueError, match="max memory must be at least"):
        Settings(max_memory=1 << 20)
    assert Settings(max_memory=1 << 30).max_memory == 1 << 30


def test_a_seed_is_from_0_to_what_the_database_stores():
    """A negative seed would be refused by numpy late, in the worker, and `random.Random(-1)`
    would repeat seed 1; past 2**63 - 1 SQLite cannot store it."""
    assert check_seed(0) == 0 and check_seed(MAX_SEED) == 2**63 - 1
    for bad, message in ((-1, "from 0 to 2\\*\\*63 - 1, got -1"), (2**63, "from 0"),
                         (1.0, "an integer"), (True, "an integer")):
        with pytest.raises(ValueError, match=message):
            check_seed(bad)
    with pytest.raises(ValueError, match="input seed must be from 0"):
        Settings(input_seed=-1)


def test_a_candidate_whose_trace_cannot_be_derived_is_recorded_as_an_error(db, naive, candidate,
                                                                          monkeypatch):
    cand = dataclasses.replace(candidate)  # a copy whose trace is not derived yet

    def cannot_derive(*args):
        raise DeriveError("the test's missing primitive")

    monkeypatch.setattr("eqsched.extract.search.derive", cannot_derive)
    monkeypatch.setattr(trials_module, "measure", no_measuring)
    trial = measurer(db, naive).trial(cand, 1e-3, round_index=0)
    assert trial.correct is None and not trial.cached
    assert trial.error == "no replayable trace: the test's missing primitive"
    (record,) = db.records("matmul", SIZE)
    assert record.error == trial.error and record.trace == [] and record.median_s is None


def test_a_contended_timing_is_taken_again_until_the_machine_stays_busy(db, naive, candidate,
                                                                       monkeypatch):
    asked = []

    def busy_machine(prog, **kw):  # another process keeps a core busy at every timing
        asked.append((kw["contended_cores"], kw["retimes"]))
        return Measurement(correct=True, times=[1e-3], median_s=1e-3, gflops=1.0,
                           others_cores=1.0, retimed=kw["retimes"])

    monkeypatch.setattr(trials_module, "measure", busy_machine)
    m = Measurer(db, "matmul", SIZE, naive, FAST, None, TimingGate(), jobs=2)
    for _ in range(trials_module.BUSY_FOR_GOOD + 2):
        m._measure(candidate, 0)
    # Two jobs time beside each other on purpose: one core of theirs is not contention.
    assert {limit for limit, _ in asked} == {FAST.contended_cores + 1}
    alone = Measurer(db, "matmul", SIZE, naive, FAST, None, TimingGate())
    asked.clear()
    for _ in range(trials_module.BUSY_FOR_GOOD + 2):
        alone._measure(candidate, 0)
    assert [retimes for _, retimes in asked] == [1] * trials_module.BUSY_FOR_GOOD + [0, 0]
    assert alone.contended == trials_module.BUSY_FOR_GOOD + 2


def test_the_naive_time_is_measured_once_per_machine_and_target(db, naive, monkeypatch):
    first = measurer(db, naive).naive_median_s()
    assert first > 0
    avx2 = Measurer(db, "matmul", SIZE, naive, dataclasses.replace(FAST, target="haswell"),
                    None, TimingGate())
    assert avx2.naive_median_s() > 0
    monkeypatch.setattr(trials_module, "measure", no_measuring)
    assert measurer(db, naive).naive_median_s() == first
    (record,) = db.records("matmul", SIZE)
    assert record.structure == "naive" and record.program_hash == naive.hash()
    assert db.records("matmul", SIZE, target="haswell")[0].program_hash == naive.hash()


def test_the_timing_gate_holds_the_search_while_a_candidate_is_timed():
    gate = TimingGate()
    gate.wait_turn()  # nothing timed: no wait
    gate.on_timing(True)
    gate.on_timing(True)  # two jobs time at once
    passed = threading.Event()
    searcher = threading.Thread(target=lambda: (gate.wait_turn(), passed.set()), daemon=True)
    searcher.start()
    assert not passed.wait(0.2)
    gate.on_timing(False)
    assert not passed.wait(0.2)  # the other job still times
    gate.on_timing(False)
    assert passed.wait(10)
    searcher.join(10)


def test_a_timing_starts_once_the_searchs_unit_of_work_in_progress_has_ended():
    # The unit a search is in when a timing is asked for runs to its end, then the search
    # waits; the timing starts only then, so the search's CPU time is never in the window.
    gate = TimingGate()
    in_unit, end_unit, parked_at_turn = threading.Event(), threading.Event(), threading.Event()

    def search():
        with gate.searching():
            in_unit.set()
            end_unit.wait(30)
            parked_at_turn.set()
            gate.wait_turn()  # the next unit waits for the timing to end

    searcher = threading.Thread(target=search, daemon=True)
    searcher.start()
    assert in_unit.wait(10)
    started = threading.Event()
    timer = threading.Thread(target=lambda: (gate.on_timing(True), started.set()), daemon=True)
    timer.start()
    assert not started.wait(0.2)  # the search is still in its unit
    end_unit.set()
    assert started.wait(10) and parked_at_turn.is_set()
    searcher.join(0.2)
    assert searcher.is_alive()  # held at wait_turn while the candidate is timed
    gate.on_timing(False)
    searcher.join(10)
    assert not searcher.is_alive()
    # A search that has ended is not waited for; one measuring itself does not wait for itself.
    gate.on_timing(True)
    gate.on_timing(False)
    with gate.searching():
        gate.on_timing(True)
        gate.on_timing(False)


def test_a_search_interrupted_while_it_waits_its_turn_holds_up_no_later_timing(monkeypatch):
    gate = TimingGate()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C while the search waits for a candidate's timing

    with pytest.raises(KeyboardInterrupt), gate.searching():
        monkeypatch.setattr(gate._changed, "wait_for", interrupted)
        gate.wait_turn()
    monkeypatch.undo()
    # The run then stops its measuring thread, which waits for the timing it had begun.
    started = threading.Event()
    timer = threading.Thread(target=lambda: (gate.on_timing(True), started.set()), daemon=True)
    timer.start()
    assert started.wait(10)
    gate.on_timing(False)


def test_a_search_that_waits_its_turn_is_off_the_machine_while_a_candidate_is_timed(naive):
    # Units of busy work between calls of wait_turn, as explore's search runs beside a round:
    # the timing waits for the unit in progress, and none runs in its window, loaded machine
    # or not (without the gate the caller's CPU time in the window is about a core).
    gate, stop = TimingGate(), threading.Event()

    def search():
        with gate.searching():
            while not stop.is_set():
                start = time.perf_counter()
                while time.perf_counter() - start < 0.02:
                    pass
                gate.wait_turn()

    searcher = threading.Thread(target=search)
    searcher.start()
    try:
        m = measure(naive, repeats=3, contended_cores=0.5, retimes=0, on_timing=gate.on_timing)
    finally:
        stop.set()
        searcher.join()
    assert m.correct is True and m.caller_cores is not None and m.caller_cores < 0.2


def test_the_measurement_key_has_the_thread_count_only_for_parallel_programs(naive):
    sch = Schedule(naive)
    sch.parallel("C.i")
    parallel = sch.program
    assert measurement_key(naive, Settings(threads=3)) == naive.hash()
    assert measurement_key(parallel, Settings(threads=3)) == f"{parallel.hash()}/threads=3"
    assert measurement_key(parallel, Settings(threads=1)) == f"{parallel.hash()}/threads=1"
