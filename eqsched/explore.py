"""The measure-and-refine loop: saturate, pick what the cost model likes, measure, learn, repeat.

    result = explore("matmul", (512, 512, 512), trials=64, db="eqsched.db", seed=0)
    result.best.gflops, result.best_program.text(), result.best_trace, result.rounds

Every round the search (`eqsched.extract.search`) proposes a batch the run has not tried yet; each
candidate is looked up in the database first (same workload, program and machine: its stored
measurement is used, nothing is run) and otherwise measured in a worker process, checked against
the numpy reference before it is timed, and stored at once. The cost model then learns from the
batch and the next round is ranked with it. A candidate looked up counts as a trial like a
measured one, so re-running the same exploration (same seed, same database) walks the same path
and measures nothing new; an interrupted run resumes where it stopped.

Only correct programs can be the best. Wall-clock budgets (`seconds`) end a run early and so make
it depend on the machine's speed; the trial budget alone keeps it deterministic given the
database's measurements.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import machine
from .db import Database, Record
from .egraph.derive import DeriveError, derive
from .egraph.saturate import Limits, saturate
from .egraph.space import Space
from .egraph.term import show
from .extract import cost_model_for
from .ir import Program, naive_program
from .runner import Measurement, measure
from .trials import Settings, has_parallel_loops, measurement_key
from .workloads import get_workload

DEFAULT_DB = "eqsched.db"


@dataclass
class Trial:
    """One candidate of the run, measured now or found in the database."""

    round: int
    program_hash: str
    structure: str
    predicted_s: float
    median_s: float | None
    gflops: float | None
    correct: bool | None
    error: str | None
    cached: bool  # found in the database: not measured by this run


@dataclass
class Round:
    index: int
    trials: list[Trial]
    spearman: float | None  # predicted vs measured seconds of the round's correct trials
    kendall: float | None
    best_gflops: float | None  # best so far, after this round
    seconds: float


@dataclass
class ExploreResult:
    workload: str
    size: list[int]
    seed: int
    cost_model: str
    rules: list[str]
    budget: dict[str, Any]
    rounds: list[Round] = field(default_factory=list)
    best: Trial | None = None
    best_program: Program | None = None
    best_trace: list[dict] = field(default_factory=list)
    naive_median_s: float | None = None
    peak_gflops: float | None = None
    space: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    interrupted: bool = False
    run_id: int | None = None
    db_path: str = ""

    @property
    def trials(self) -> list[Trial]:
        return [t for r in self.rounds for t in r.trials]

    @property
    def measured(self) -> int:
        """Trials this run measured itself (not found in the database)."""
        return sum(not t.cached for t in self.trials)

    def to_json(self) -> dict[str, Any]:
        best = self.best
        return {
            "workload": self.workload, "size": self.size, "seed": self.seed,
            "cost_model": self.cost_model, "rules": self.rules, "budget": self.budget,
            "trials": len(self.trials), "measured": self.measured,
            "best_gflops": best.gflops if best else None,
            "best_median_s": best.median_s if best else None,
            "best_hash": best.program_hash if best else None,
            "correct": bool(best and best.correct),
            "percent_of_peak": (100 * best.gflops / self.peak_gflops
                                if best and best.gflops and self.peak_gflops else None),
            "speedup_over_naive": (self.naive_median_s / best.median_s
                                   if best and best.median_s and self.naive_median_s else None),
            "naive_median_s": self.naive_median_s, "peak_gflops": self.peak_gflops,
            "trace": self.best_trace,
            "program": self.best_program.text() if self.best_program else None,
            "rounds": [{"round": r.index, "spearman": r.spearman, "kendall": r.kendall,
                        "best_gflops": r.best_gflops, "seconds": r.seconds,
                        "trials": [asdict(t) for t in r.trials]} for r in self.rounds],
            "space": self.space, "wall_s": self.wall_s, "interrupted": self.interrupted,
            "run_id": self.run_id, "db": self.db_path,
        }


Progress = Callable[[str, dict[str, Any]], None]


def explore(workload: str, size: tuple[int, ...] | None = None, *, trials: int = 64,
            seconds: float | None = None, db: str | Path | Database = DEFAULT_DB, seed: int = 0,
            cost_model: Any = "learned", rules: Any = None, limits: Limits | None = None,
            batch: int = 16, jobs: int = 1, settings: Settings | None = None,
            measure_naive: bool = True, progress: Progress | None = None) -> ExploreResult:
    """Explore the schedule space of `workload` at `size` (default: the workload's default) for
    `trials` candidates and/or `seconds` of wall time; see the module docstring."""
    from .extract.cost import kendall, spearman
    from .extract.search import EvolutionarySearch
    from .rules import resolve

    started = time.perf_counter()
    if trials < 1 or batch < 1 or jobs < 1:
        raise ValueError(f"trials, batch and jobs must be >= 1, got {trials}, {batch}, {jobs}")
    wl = get_workload(workload)
    size = wl.check_size(tuple(size)) if size is not None else wl.default_size
    settings = settings or Settings()
    say = progress or (lambda event, data: None)
    database = db if isinstance(db, Database) else Database(db)
    try:
        model = cost_model_for(cost_model, settings.options().thread_count)
        chosen_rules = resolve(rules)
    except Exception:
        if not isinstance(db, Database):
            database.close()
        raise
    naive = naive_program(wl.build(*size))
    result = ExploreResult(wl.name, list(size), seed, model.name, [r.name for r in chosen_rules],
                           {"trials": trials, "seconds": seconds, "batch": batch},
                           db_path=str(getattr(database, "path", db)))
    say("saturating", {"workload": wl.name, "size": list(size)})
    sat = saturate(naive, chosen_rules, limits)
    space = Space(sat)
    rep = sat.report
    result.space = {"stop_reason": rep.stop_reason, "seconds": rep.seconds, "enodes": rep.enodes,
                    "eclasses": rep.eclasses, "programs": space.count()}
    facts = machine.describe()  # with the measured FMA peak (once per process)
    result.run_id = database.start_run(
        workload=wl.name, size=list(size), seed=seed, budget=result.budget,
        rules=result.rules, cost_model=model.name, machine=facts,
        versions=facts.get("versions", {}), config=asdict(settings))
    # The search runs beside the measurements (see below) but never while a candidate is timed:
    # its memory traffic slowed mm_exp_mm's timings by up to 30%, and unevenly.
    timing_lock, timing_now, quiet = threading.Lock(), [0], threading.Event()
    quiet.set()

    def on_timing(started: bool) -> None:
        with timing_lock:
            timing_now[0] += 1 if started else -1
            (quiet.clear if timing_now[0] else quiet.set)()

    # A first-round population predicted at half of one core's peak or better needs no more
    # islands (half of all cores' peak kept conv2d at three islands on two cores).
    search = EvolutionarySearch(
        space, model, seed=seed, wait_turn=quiet.wait,
        settled_s=naive.computation.flops / (0.5 * facts["peak_gflops_per_core"] * 1e9))
    measured: set[str] = set()
    elites: list = []  # measured correct candidates, fastest first
    times_of: dict[str, float] = {}
    best_program = None

    def run_one(job: tuple[int, Any, float], round_index: int) -> Trial:
        worker, cand, predicted = job
        key = measurement_key(cand.program, settings)
        stored = database.lookup(wl.name, list(size), key)
        if stored is not None:
            return Trial(round_index, cand.hash, show(cand.term), predicted, stored.median_s,
                         stored.gflops, stored.correct, stored.error, cached=True)
        try:
            trace = derive(cand.term, cand.sizes, naive)
        except DeriveError as err:
            # Only replayable programs may be reported; this one is recorded as an error.
            trace, m = [], Measurement(correct=None, error=f"no replayable trace: {err}")
        else:
            m = measure(cand.program, repeats=settings.repeats, warmup=settings.warmup,
                        timeout_s=settings.timeout_s, seed=settings.input_seed,
                        time_budget_s=settings.time_budget_s, min_repeats=settings.min_repeats,
                        worker=worker, on_timing=on_timing,
                        options=settings.options())
        record = Record(
            workload=wl.name, size=list(size), program_hash=key, structure=show(cand.term),
            sizes={f"{g}|{p}": e for (g, p), e in cand.sizes.items()},
            trace=trace, times=m.times, median_s=m.median_s,
            gflops=m.gflops, correct=m.correct, error=m.error or (
                None if m.correct is not False else f"wrong result: {m.check_message}"),
            predicted_s=predicted, round=round_index, run_id=result.run_id)
        database.add(record)
        return Trial(round_index, cand.hash, record.structure, predicted, m.median_s, m.gflops,
                     m.correct, record.error, cached=False)

    pool = ThreadPoolExecutor(jobs) if jobs > 1 else None
    # While a round is measured (in worker processes) the next one is searched, so round r + 1
    # is ranked with what rounds up to r - 1 taught the model. The search waits instead when
    # every core already measures; the proposals are the same either way.
    overlap = jobs < (os.cpu_count() or 1)
    measuring = ThreadPoolExecutor(1)
    stop = threading.Event()
    status = "running"
    proposed: list = []
    done: list[Trial] = []
    round_index, round_started = 0, time.perf_counter()

    def measure_round(proposed: list, round_index: int, into: list[Trial]) -> None:
        jobs_ = [(i % jobs, c, p) for i, (c, p) in enumerate(proposed)]
        if pool is None:
            for job in jobs_:
                if stop.is_set():
                    return
                into.append(run_one(job, round_index))
        else:
            into.extend(pool.map(lambda j: run_one(j, round_index), jobs_))

    def next_batch(planned: int) -> list:
        left = trials - len(result.trials) - planned
        if left <= 0 or (seconds is not None and time.perf_counter() - started > seconds):
            return []
        return search.propose(min(batch, left), exclude=measured, elites=elites[:8])

    def close_round(whole: bool) -> None:
        nonlocal elites, best_program
        by_hash = {c.hash: c for c, _ in proposed}
        good = [t for t in done if t.correct and t.median_s]
        model.update([by_hash[t.program_hash].program for t in good], [t.median_s for t in good])
        for t in good:
            if result.best is None or t.median_s < result.best.median_s:
                result.best, best_program = t, by_hash[t.program_hash]
        times_of.update((t.program_hash, t.median_s) for t in good)
        elites = sorted([*elites, *(by_hash[t.program_hash] for t in good)],
                        key=lambda c: times_of[c.hash])
        predicted, times = [t.predicted_s for t in good], [t.median_s for t in good]
        result.rounds.append(Round(
            round_index, list(done), spearman(predicted, times) if whole else None,
            kendall(predicted, times) if whole else None,
            result.best.gflops if result.best else None, time.perf_counter() - round_started))

    try:
        if measure_naive:
            result.naive_median_s = _naive_time(database, naive, wl.name, list(size), settings,
                                                result.run_id)
        proposed = next_batch(0)
        while proposed:
            measured |= {c.hash for c, _ in proposed}
            flight = measuring.submit(measure_round, proposed, round_index, done)
            if not overlap:
                flight.result()
            upcoming = next_batch(len(proposed))
            flight.result()
            close_round(whole=True)
            finished, done = done, []
            say("round", {"round": round_index, "trials": len(result.trials), "of": trials,
                          "best_gflops": result.rounds[-1].best_gflops,
                          "spearman": result.rounds[-1].spearman,
                          "measured": sum(not t.cached for t in finished)})
            proposed = upcoming
            round_index, round_started = round_index + 1, time.perf_counter()
        if len(result.trials) < trials and not (
                seconds is not None and time.perf_counter() - started > seconds):
            say("exhausted", {"trials": len(result.trials)})
    except KeyboardInterrupt:
        result.interrupted = True
    except Exception:
        status = "failed"  # every measurement so far is stored; the run says it did not finish
        raise
    finally:
        stop.set()  # the round in flight ends after the measurement in progress
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        measuring.shutdown(cancel_futures=True)
        if done:  # a round an interrupt cut short: its finished trials count
            close_round(whole=False)
        if best_program is not None:
            result.best_program = best_program.program
            parallel = has_parallel_loops(best_program.program)
            cores = settings.options().thread_count if parallel else 1
            result.peak_gflops = facts["peak_gflops_per_core"] * cores
            result.best_trace = derive(best_program.term, best_program.sizes, naive)
        result.wall_s = time.perf_counter() - started
        summary = {k: v for k, v in result.to_json().items()
                   if k in ("trials", "measured", "best_gflops", "best_median_s", "best_hash",
                            "wall_s", "naive_median_s", "peak_gflops", "percent_of_peak",
                            "speedup_over_naive", "space")}
        if status != "failed":
            status = "interrupted" if result.interrupted else "done"
        database.finish_run(result.run_id, status=status, summary=summary)
        if not isinstance(db, Database):
            database.close()
    return result


def _naive_time(database: Database, naive: Program, workload: str, size: list[int],
                settings: Settings, run_id: int) -> float | None:
    """The naive program's median time (for the speedup), measured once per machine."""
    stored = database.lookup(workload, size, naive.hash())
    if stored is None:
        m = measure(naive, repeats=1, warmup=0, timeout_s=settings.timeout_s,
                    seed=settings.input_seed, options=settings.options())
        stored = Record(workload=workload, size=size, program_hash=naive.hash(),
                        structure="naive", sizes={}, trace=[], times=m.times,
                        median_s=m.median_s, gflops=m.gflops, correct=m.correct, error=m.error,
                        run_id=run_id)
        database.add(stored)
    return stored.median_s if stored.correct else None
