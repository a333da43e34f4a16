"""The measure-and-refine loop: saturate, pick what the cost model likes, measure, learn, repeat.

    result = explore("matmul", (512, 512, 512), trials=64, db="eqsched.db", seed=0)
    result.best.gflops, result.best_program.text(), result.best_trace, result.rounds
    explore("matmul", (512, 512, 512), target="host,-avx512f")   # AVX2 code on this machine

Every round the search (`eqsched.extract.search`) proposes a batch the run has not tried yet; each
candidate is looked up in the database first (same workload, program, machine and target: its
stored measurement is used, nothing is run) and otherwise measured in a worker process, checked
against the numpy reference before it is timed, and stored at once (`eqsched.trials`: the
settings, the measurement key, measuring or looking up one candidate). The cost model then learns
from the batch and the next round is ranked with it. The learned model starts from every
measurement the database holds of this machine and target (all runs and workloads, and a
model's tasks its tuner is given, `LearnedModel.add_history`), so a run ranks its first round
with what earlier runs taught; a run
of settings the database has run before (same workload, size, seed, budget, rules, cost model and
measurement settings) starts from what the first of them started from (`_learned_from`), not from
what that one measured, so it walks the same path. The
target (`Settings.target`, the host by default) decides what code is generated and which vector
lanes the space offers; one this machine cannot run is refused before anything is saturated. A
candidate looked up counts as a trial like a measured one, so re-running the same exploration
(same seed, same database) walks the same path and measures nothing new; an interrupted run
resumes where it stopped.

While a round is measured the next one is searched (`_Exploration.rounds`), but never while a
candidate is timed (`trials.TimingGate`); the proposals are the same as if it searched after.

`explore` is one `TaskTuner` given its whole budget at once. A tuner explores any `te.Computation`
(a fused task of a model, made at run time), stored under `computation_key` unless it is a
registered workload, and can be stepped a few trials at a time: it saturates once, and its search,
elites and cost model carry over from one slice to the next (a task scheduler's rounds; with
`search_ahead` a slice's next round is searched while its last is measured, as within one call).

    tuner = TaskTuner(computation, db="eqsched.db", cost_model="analytic")
    tuner.tune(16); tuner.tune(16)        # the best seconds after each slice
    result = tuner.close()                # the finalists, the checked trace, the run's status

Only correct programs can be the best, and the best is reported only once its trace, replayed on
the naive program, gives the program that was measured (else the run fails with an ExploreError).
The run is recorded before saturation, and its status says how it ended: `done` only when the
rounds ran to their end, `interrupted` after Ctrl-C (or SIGTERM, which the command line turns into
one), `failed` for anything else, an egglog panic among them (`SaturationError`).

Wall-clock budgets (`seconds`) end a run early and so make it depend on the machine's speed; the
trial budget alone keeps it deterministic given the database's measurements. A run also ends when
the search has nothing untried left (a small space, all measured); `ExploreResult.stop_reason`
says which ended it.

See docs/ARCHITECTURE.md §10 Exploration.
"""

from __future__ import annotations

import contextlib
import gc
import math
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .backend import Target
from .db import Database, DatabaseError, TrainingRow, training_rows, training_set
from .default_schedule import default_schedule
from .egraph.saturate import Limits, saturate
from .egraph.space import Space
from .egraph.term import vector_lanes
from .extract import Candidate, CostModel, EvolutionarySearch, cost_model_for
from .extract.cost import kendall, spearman
from .extract.learned import LearnedModel
from .ir import Program, naive_program
from .machine_model import describe, machine_model
from .runner import check_fits_in_memory
from .schedule import Schedule, ScheduleError
from .te import Computation
from .trials import (
    Baseline,
    Measurer,
    Settings,
    TimingGate,
    Trial,
    check_seed,
    has_parallel_loops,
)
from .workloads import get_workload

if TYPE_CHECKING:  # the rule plug-ins load when a run resolves its rules, not on import
    from .rules import Spec as RuleSpec

DEFAULT_DB = "eqsched.db"
POPULATION = EvolutionarySearch.__init__.__kwdefaults__["population"]
# The first round stops adding islands once its best is predicted at this share of the peak of
# the cores the program may use: lower, the analytic model's optimism settled mm_exp_mm and
# matmul 197x3072x768 after one island on programs that three islands beat
# (docs/ARCHITECTURE.md §17.3).
SETTLED_SHARE = 0.9
__all__ = ["DEFAULT_DB", "ExploreError", "ExploreResult", "Progress", "Round", "Settings",
           "TaskTuner", "Trial", "computation_key", "explore"]


class ExploreError(RuntimeError):
    """An exploration that cannot report its result truthfully; one line saying why."""


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
    target: str = "host"  # the spec of the target the programs were compiled for
    rounds: list[Round] = field(default_factory=list)
    best: Trial | None = None
    best_program: Program | None = None
    best_trace: list[dict] = field(default_factory=list)
    naive_median_s: float | None = None
    peak_gflops: float | None = None
    space: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    interrupted: bool = False
    stop_reason: str = ""  # why the rounds ended: a budget spent, the space exhausted, Ctrl-C
    run_id: int | None = None
    db_path: str = ""
    # The finalists timed again side by side at the end (Settings.finalists): hash, in-run and
    # re-measured GFLOPS each; `best` is the fastest re-measured, with its re-measured time.
    finalists: list[dict[str, Any]] = field(default_factory=list)
    in_run_best_gflops: float | None = None  # the best single measurement of the rounds
    # measured candidates passed over because their trace rebuilds another program (a derive
    # bug, never a reported result)
    unreplayable: list[str] = field(default_factory=list)

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
            "target": self.target, "trials": len(self.trials), "measured": self.measured,
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
            "stop_reason": self.stop_reason, "finalists": self.finalists,
            "in_run_best_gflops": self.in_run_best_gflops, "unreplayable": self.unreplayable,
            "run_id": self.run_id, "db": self.db_path,
        }


Progress = Callable[[str, dict[str, Any]], None]


def check_seconds(seconds: Any) -> float:
    """`seconds` as a float when it is a usable wall-time budget (more than 0, finite);
    otherwise a ValueError that names it. A budget of 0 or less would saturate the space only
    to measure nothing; nan would never end the run."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise ValueError(f"seconds must be a number of seconds, got {seconds!r}")
    if not 0 < seconds < math.inf:  # also refuses nan
        raise ValueError(f"seconds must be more than 0 and finite, got {seconds!r}")
    return float(seconds)


def explore(workload: str, size: tuple[int, ...] | None = None, *, trials: int = 64,
            seconds: float | None = None, db: str | Path | Database = DEFAULT_DB, seed: int = 0,
            cost_model: str | CostModel = "learned", rules: RuleSpec = None,
            limits: Limits | None = None,
            batch: int = 16, jobs: int = 1, population: int = POPULATION,
            settings: Settings | None = None,
            target: str | Target | None = None, measure_naive: bool = True,
            progress: Progress | None = None) -> ExploreResult:
    """Explore the schedule space of `workload` at `size` (default: the workload's default) for
    `trials` candidates and/or `seconds` of wall time; see the module docstring. `target`, when
    given, replaces `settings.target` ("host", "host,-avx512f", "haswell", a Target);
    `population`: the candidates the search evolves each round (docs/ARCHITECTURE.md §9)."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    wl = get_workload(workload)
    size = wl.check_size(tuple(size)) if size is not None else wl.default_size
    tuner = TaskTuner(wl.build(*size), key=(wl.name, list(size)), trials=trials,
                      seconds=seconds, db=db, seed=seed, cost_model=cost_model, rules=rules,
                      limits=limits, batch=batch, jobs=jobs, population=population,
                      settings=settings, target=target, measure_naive=measure_naive,
                      progress=progress)
    try:
        tuner.tune(trials)
    finally:
        result = tuner.close()
    return result


def _learned_from(database: Database, workload: str, size: list[int], *, threads: int,
                  target: str, **run_settings: Any
                  ) -> tuple[list[TrainingRow], dict, int | None]:
    """The stored measurements a run's learned model starts from (`db.training_rows`, read
    once here), what they are (`db.training_set`), and the id of the earlier run it takes them
    from, if any. A run of settings that ran before on this machine starts where the latest of
    those started (which took it from the first), when the database still holds exactly those
    measurements: it ranks as they did, so it proposes what they proposed and looks up what
    they measured (a finished run measures nothing new, an interrupted one goes on where it
    stopped). Any other run starts from all of them."""
    for run in reversed(database.runs_like(workload, size, **run_settings)):
        then = run["learned_from"]
        if then is None or then["machine"] != database.machine_fp:
            continue
        rows = training_rows(database, threads=threads, target=target, until=then["until"])
        if training_set(rows, database.machine_fp) == then:
            return rows, then, run["id"]
    rows = training_rows(database, threads=threads, target=target)
    return rows, training_set(rows, database.machine_fp), None


def computation_key(comp: Computation) -> tuple[str, list[int]]:
    """The database key (workload, size) of a computation that is no registered workload: its
    name with the hash of its naive program (every stage's shapes, indices and body, and the
    name), and no size. Two different computations under one name are kept apart."""
    return f"{comp.name}@{naive_program(comp).hash()}", []


class TaskTuner:
    """An exploration of one computation that its caller steps: each `tune(trials)` measures
    up to `trials` more candidates and returns the best time so far; `close()` re-measures the
    finalists, checks the best's trace and records how the run ended. Saturation happens once,
    on the first `tune`; the search, its elites, the trials tried and the cost model carry over
    from one call to the next, so a task scheduler can give a task a few trials at a time.

        tuner = TaskTuner(computation, db=database, cost_model="analytic")
        tuner.tune(16); tuner.tune(16)   # two slices of one run: best seconds after each
        result = tuner.close()           # an ExploreResult, as explore returns

    `key` is the (workload, size) its measurements are stored under: a registered workload's
    for `explore`, else `computation_key(computation)`. `trials` is the budget the run is
    recorded with (explore's whole budget, which `batch` compares to skip a job already done);
    None for a run whose caller decides it slice by slice. Within one call, each round is
    searched while the one before is measured. `search_ahead`, for a caller that will call
    again (a task scheduler): the round after a call's last is searched too while that one is
    measured, and the next call starts with it; a run stepped in whole rounds then proposes what
    one call proposes. Without it, a call's first round is searched after the last round of the
    one before was learned from, while nothing is measured. Given the same slices and database a
    run walks the same path, and a re-run measures nothing new. `measure_default`: the
    computation's `default_schedule` is the run's first trial (round 0, counted in the budget),
    so its best is never slower than what the computation runs untuned; task tuning asks for it,
    `explore` does not (its result is what the space found). All calls must come from one
    thread (the one that owns the e-graph). `related`: other computations (a model's other
    tasks) whose stored measurements the learned model also starts from."""

    def __init__(self, computation: Computation, *, key: tuple[str, list[int]] | None = None,
                 trials: int | None = None, seconds: float | None = None,
                 db: str | Path | Database = DEFAULT_DB, seed: int = 0,
                 cost_model: str | CostModel = "learned",
                 rules: RuleSpec = None, limits: Limits | None = None, batch: int = 16,
                 jobs: int = 1, population: int = POPULATION, settings: Settings | None = None,
                 target: str | Target | None = None, measure_naive: bool = True,
                 measure_default: bool = False, progress: Progress | None = None,
                 related: Sequence[Computation] = (), search_ahead: bool = False):
        from .rules import resolve

        self.budget = _Budget(0, None if seconds is None else check_seconds(seconds), batch,
                              started=time.perf_counter())
        if batch < 1 or jobs < 1:
            raise ValueError(f"batch and jobs must be >= 1, got {batch}, {jobs}")
        self.population = check_population(population)
        check_seed(seed)
        workload, size = key if key is not None else computation_key(computation)
        settings = settings or Settings()
        if target is not None:
            settings = replace(settings, target=target)
        self.options = settings.options()
        self.options.target.check_runs_here()
        check_fits_in_memory(computation, settings.max_memory)  # before the e-graph is built
        self.say = progress or (lambda event, data: None)
        self.own_database = not isinstance(db, Database)
        self.database = db if isinstance(db, Database) else Database(db)
        budget = {"trials": trials, "seconds": seconds, "batch": batch, "population": population}
        learned_from = None
        try:
            self.model = cost_model_for(cost_model, self.options.thread_count,
                                        self.options.target)
            self.rules = resolve(rules)
            if isinstance(self.model, LearnedModel):
                rows, learned_from, again = _learned_from(
                    self.database, workload, list(size), seed=seed, budget=budget,
                    rules=[r.name for r in self.rules], cost_model=self.model.name,
                    config=asdict(settings), threads=self.options.thread_count,
                    target=settings.target)
                # Tasks of a model are stored under keys no registry rebuilds: name them.
                known = {computation_key(c)[0]: c for c in (computation, *related)}
                stored = self.model.add_history(self.database, rows=rows, computations=known)
                self.say("learning", {"stored": stored, "as_run": again})
        except Exception:
            self.close_database()
            raise
        self.naive = naive_program(computation)
        self.settings, self.seed, self.limits, self.jobs = settings, seed, limits, jobs
        self.measure_naive, self.measure_default = measure_naive, measure_default
        self.search_ahead = search_ahead
        self.result = ExploreResult(
            workload, list(size), seed, self.model.name, [r.name for r in self.rules], budget,
            target=settings.target,
            db_path=str(getattr(self.database, "path", db)))
        self.run: _Exploration | None = None  # built on the first `tune`
        self.closed = False
        try:
            self.facts = describe(self.options.target)  # with the target's calibrated FMA peak
            self.result.run_id = self.database.start_run(
                workload=workload, size=list(size), seed=seed, budget=self.result.budget,
                rules=self.result.rules, cost_model=self.model.name, machine=self.facts,
                versions=self.facts.get("versions", {}), config=asdict(settings),
                learned_from=learned_from)
        except BaseException:
            self.close_database()
            raise

    @property
    def best_s(self) -> float | None:
        """The best correct program's median seconds so far (None: none yet)."""
        best = self.result.best
        return best.median_s if best is not None else None

    @property
    def trials_taken(self) -> int:
        """Trials so far, measured or looked up, over every slice."""
        return len(self.result.trials)

    @property
    def interrupted(self) -> bool:
        return self.result.interrupted

    @property
    def stop_reason(self) -> str:
        """Why the last slice ended (a budget spent, the space exhausted, an interrupt)."""
        return self.result.stop_reason

    @property
    def failure(self) -> str:
        """Why no trial so far gave a valid program, in a few words: the commonest first clause
        of the trials' errors (the latest among equals) and how many trials it ended, like
        "wrong result (16 of 16 trials)"; "" once one is valid, and before any trial."""
        trials = self.result.trials
        if not trials or any(t.correct and t.median_s for t in trials):
            return ""
        clauses = [_first_clause(t.error) if t.error else "not checked" for t in trials]
        common = max(reversed(clauses), key=clauses.count)
        return f"{common} ({clauses.count(common)} of {len(trials)} trials)"

    @property
    def exhausted(self) -> bool:
        """Whether the last `tune` ended short of its trials: the space has nothing untried
        left, the time budget is spent, or it was interrupted."""
        return (self.result.interrupted or self.budget.out_of_time()
                or len(self.result.trials) < self.budget.trials)

    def tune(self, trials: int) -> float | None:
        """Measure (or look up) up to `trials` more candidates; the best seconds so far. After
        an interrupt or `close` it measures nothing."""
        if trials < 1:
            raise ValueError(f"trials must be >= 1, got {trials}")
        if self.closed or self.result.interrupted:
            return self.best_s
        self.budget.trials = len(self.result.trials) + trials
        with self._failing_the_run():
            if self.run is None:
                self.run = self._start()
            self.run.step()
        return self.best_s

    def close(self) -> ExploreResult:
        """End the run: re-measure the finalists (unless interrupted), report the best with its
        checked trace, store the run's status (`done`, `interrupted`, or `failed` with the
        error raised again) and close a database this tuner opened. Closing twice does
        nothing more."""
        if self.closed:
            return self.result
        self.closed = True
        status = "failed"
        try:
            with self._failing_the_run():
                if self.run is not None:
                    self.run.finish()
            status = "interrupted" if self.result.interrupted else "done"
        finally:
            self.result.wall_s = time.perf_counter() - self.budget.started
            try:
                if status != "failed":  # a failure has finished the run already
                    self.database.finish_run(self.result.run_id, status=status,
                                             summary=_summary(self.result))
            finally:
                self.close_database()
        return self.result

    def _start(self) -> _Exploration:
        self.say("saturating", {"workload": self.result.workload, "size": self.result.size})
        space, self.result.space = _saturate(self.naive, self.rules, self.limits,
                                             vector_lanes(self.options.target.vector_lanes))
        self.say("saturated", {"workload": self.result.workload, **self.result.space})
        gate = TimingGate()
        search = _search(space, self.model, self.seed, gate,
                         machine_model(self.options.target).peak_gflops, self.population,
                         self.options.thread_count)
        measurer = Measurer(self.database, self.result.workload, self.result.size, self.naive,
                            self.settings, self.result.run_id, gate, self.jobs)
        run = _Exploration(self.result, self.model, search, measurer, self.budget,
                           self.facts["peak_gflops_per_core"], self.jobs, self.say,
                           self.search_ahead)
        if self.measure_naive:
            run.measure_naive()
        if self.measure_default and not self.result.interrupted:
            sch = default_schedule(self.naive.computation, self.options.target.vector_lanes)
            run.measure_baseline(Baseline(sch.program, sch.trace))
        return run

    @contextlib.contextmanager
    def _failing_the_run(self) -> Iterator[None]:
        """An interrupt before the rounds (saturating, say) ends the run `interrupted`; the
        rounds handle their own. Any other exception marks the run `failed` in the database
        (its measurements so far are stored) and is raised again, so `batch` runs it again."""
        try:
            yield
        except KeyboardInterrupt:
            self.result.interrupted, self.result.stop_reason = True, "interrupted"
        except BaseException as err:
            self.closed = True
            self.result.stop_reason = f"failed: {type(err).__name__}: {err}".splitlines()[0]
            self.result.wall_s = time.perf_counter() - self.budget.started
            try:
                self.database.finish_run(self.result.run_id, status="failed",
                                         summary=_summary(self.result))
            except DatabaseError:
                # Failing already (a full disk failed a measurement's store first): that
                # error is the one to report. The run stays `running`, shown `abandoned`.
                pass
            finally:
                self.close_database()
            raise

    def close_database(self) -> None:
        if self.own_database:
            self.own_database = False
            self.database.close()


@dataclass
class _Budget:
    trials: int
    seconds: float | None
    batch: int
    started: float  # time.perf_counter() at the start of the run

    def out_of_time(self) -> bool:
        return self.seconds is not None and time.perf_counter() - self.started > self.seconds


def _saturate(naive: Program, rules: list, limits: Limits | None, lanes: tuple[int, ...]
              ) -> tuple[Space, dict[str, Any]]:
    """The space of `naive` under `rules` (vector pieces of `lanes`), and what to report of the
    saturation."""
    sat = saturate(naive, rules, limits)
    space = Space(sat, lanes)
    rep = sat.report
    return space, {"stop_reason": rep.stop_reason, "iterations": rep.iterations,
                   "seconds": rep.seconds, "enodes": rep.enodes, "eclasses": rep.eclasses,
                   "programs": space.count()}


def time_limited(space: dict[str, Any]) -> str:
    """What to say of a space (`ExploreResult.space`) whose saturation its time limit stopped:
    the iterations it ran depend on the machine's speed and load, so another run on the same
    seed may search another space."""
    return (f"saturation stopped at its time limit after {space['iterations']} iterations "
            f"({space['seconds']:.0f} s); a slower or busier machine builds a smaller space")


def check_population(population: Any) -> int:
    """`population` if the search can evolve it (an integer of at least 2), else ValueError."""
    if isinstance(population, bool) or not isinstance(population, int) or population < 2:
        raise ValueError(f"population must be a whole number of at least 2, got {population!r}")
    return population


def _search(space: Space, model: CostModel, seed: int, gate: TimingGate,
            calibrated_peak_gflops: float, population: int, threads: int) -> EvolutionarySearch:
    """The run's search: it waits while a candidate is timed. A first-round population predicted
    at SETTLED_SHARE of the peak of the cores the program may use or better needs no more
    islands (at one core's peak, any first island of mediocre tiles made parallel passed it on
    two threads, and mm_exp_mm's two-thread winners ran slower per core than its one-thread
    ones: docs/ARCHITECTURE.md §17.3). The peak is the target's calibrated one (the machine model,
    cached on disk), never one measured in the process: that varied with the load (32 to 169
    GFLOPS on one machine), and where it fell decided how many islands ran, so which programs a
    seed proposed (§17.3). On several threads it adds each member's parallel twin to the pool
    (§9)."""
    settled_gflops = SETTLED_SHARE * threads * calibrated_peak_gflops
    return EvolutionarySearch(
        space, model, seed=seed, population=population, wait_turn=gate.wait_turn, threads=threads,
        settled_s=space.naive.computation.flops / (settled_gflops * 1e9))


class _Exploration:
    """One run of `explore`: its search, measurer and result, and what it learned so far."""

    def __init__(self, result: ExploreResult, model: CostModel, search: EvolutionarySearch,
                 measurer: Measurer, budget: _Budget, peak_gflops_per_core: float, jobs: int,
                 say: Progress, search_ahead: bool = False):
        self.result, self.model, self.search, self.measurer = result, model, search, measurer
        self.budget, self.peak_gflops_per_core, self.jobs, self.say = (
            budget, peak_gflops_per_core, jobs, say)
        # With `search_ahead`, the round after a step's last is searched while that one is
        # measured, as between two rounds of one step, and kept for the next step.
        self.search_ahead = search_ahead
        self.ahead: list[tuple[Candidate, float]] | None = None
        self.tried: set[str] = set()  # every candidate proposed so far (hashes)
        self.ranked: list[Candidate | Baseline] = []  # measured correct ones, fastest first
        self.elites: list[Candidate] = []  # those the search proposed: it breeds from them
        self.times_of: dict[str, float] = {}
        self.best: Candidate | Baseline | None = None  # the candidate of result.best
        # While a round is measured (in worker processes) the next one is searched, so round
        # r + 1 is ranked with what rounds up to r - 1 taught the model. The search stops while
        # a candidate is timed (`TimingGate`), so it shares the cores with compiling and checking
        # only, even when a parallel program's timing takes them all.
        # The measuring threads of one `step`, ended with it (a stepped run waits between
        # slices with none alive).
        self.pool: ThreadPoolExecutor | None = None
        self.measuring: ThreadPoolExecutor | None = None
        self.stop = threading.Event()
        # A space dropped earlier in this process (another run's) lives in a reference cycle
        # until the cyclic collector runs, and egglog's e-graph must be dropped on the thread
        # that made it: the measuring threads `step` starts allocate enough to run the
        # collector, which then printed "EGraph is unsendable, but is being dropped on another
        # thread". Collect here, once per run (a full collection of a large heap takes a while).
        gc.collect()
        self.proposed: list[tuple[Candidate | Baseline, float]] = []  # the round measured
        self.done: list[Trial] = []  # its trials measured so far
        self.round_index, self.round_started = 0, time.perf_counter()

    def measure_naive(self) -> None:
        """The naive program's time, for the speedup (an interrupt ends the run here)."""
        try:
            self.result.naive_median_s = self.measurer.naive_median_s()
        except KeyboardInterrupt:
            self.result.interrupted, self.result.stop_reason = True, "interrupted"

    def measure_baseline(self, baseline: Baseline) -> None:
        """`baseline` measured (or looked up) as the run's first round, one trial counted as
        any: the best until a candidate beats it, among the finalists, never proposed again,
        and no elite (the search breeds from its own candidates)."""
        predicted = float(self.model.predict([baseline.program])[0])
        self.tried.add(baseline.hash)
        self.proposed = [(baseline, predicted)]
        try:
            self.done = [self.measurer.trial(baseline, predicted, self.round_index)]
        except KeyboardInterrupt:
            self.result.interrupted, self.result.stop_reason = True, "interrupted"
            return
        self.close_round(whole=True)
        finished, self.done, self.proposed = self.done, [], []
        self.report_round(finished)
        self.round_index, self.round_started = self.round_index + 1, time.perf_counter()

    def step(self) -> None:
        """The rounds up to the budget's trials (the caller raises it slice by slice). An
        interrupt ends them with the trials so far, a round cut short among them."""
        if self.result.interrupted:
            return
        self.pool = ThreadPoolExecutor(self.jobs) if self.jobs > 1 else None
        self.measuring = ThreadPoolExecutor(1)
        self.stop = threading.Event()
        try:
            self.rounds()
        except KeyboardInterrupt:
            self.result.interrupted, self.result.stop_reason = True, "interrupted"
        finally:
            self.stop_measuring()
        if self.done:  # a round an interrupt cut short: its finished trials count
            self.close_round(whole=False)
            self.done = []

    def finish(self) -> None:
        """Unless interrupted, the finalists timed again; then the result (its best checked
        against its trace)."""
        if not self.result.interrupted:
            try:
                self.remeasure_finalists()
            except KeyboardInterrupt:
                self.result.interrupted, self.result.stop_reason = True, "interrupted"
        self.finish_result()

    def rounds(self) -> None:
        """Propose, measure (searching the next round meanwhile), learn; until the budget is
        spent or the search has nothing new."""
        self.proposed = self.next_batch(0)
        while self.proposed:
            self.tried |= {c.hash for c, _ in self.proposed}
            flight = self.measuring.submit(self.measure_round, self.proposed, self.round_index,
                                           self.done)
            upcoming = self.next_batch(len(self.proposed))
            flight.result()
            self.close_round(whole=True)
            finished, self.done = self.done, []
            self.report_round(finished)
            # A round searched while the time ran out is not measured: a run overruns its time
            # budget by the round in flight at most.
            self.proposed = [] if self.budget.out_of_time() else upcoming
            self.round_index, self.round_started = self.round_index + 1, time.perf_counter()
        self.result.stop_reason = self.why_stopped()
        if len(self.result.trials) < self.budget.trials and not self.budget.out_of_time():
            self.say("exhausted", {"trials": len(self.result.trials),
                                   "reason": self.result.stop_reason})

    def why_stopped(self) -> str:
        """Why the rounds ended: a budget is spent, or the search has nothing untried left."""
        if len(self.result.trials) >= self.budget.trials:
            return f"the trial budget ({self.budget.trials}) is spent"
        if self.budget.out_of_time():
            return f"the time budget ({self.budget.seconds:g} s) is spent"
        return self.search.exhausted

    def next_batch(self, planned: int) -> list[tuple[Candidate, float]]:
        """The next round's proposals, with `planned` trials not yet in the result. Past the
        budget, with `search_ahead`, a whole round is searched and kept for the next step
        (`ahead`), which starts with as much of it as its budget takes."""
        if self.budget.out_of_time():
            return []
        left = self.budget.trials - len(self.result.trials) - planned
        if not planned and self.ahead is not None:
            ahead, self.ahead = self.ahead, None
            return ahead[:max(left, 0)]
        if left <= 0 and planned and self.search_ahead:
            self.ahead = self.propose(self.budget.batch)
        return self.propose(min(self.budget.batch, left)) if left > 0 else []

    def propose(self, k: int) -> list[tuple[Candidate, float]]:
        with self.measurer.gate.searching():
            return self.search.propose(k, exclude=self.tried, elites=self.elites[:8])

    def measure_round(self, proposed: list[tuple[Candidate, float]], round_index: int,
                      into: list[Trial]) -> None:
        """Measure or look up a round's candidates into `into`: one by one (stopping between two
        when told to), or all at once on the pool's jobs."""
        jobs = [(i % self.jobs, c, p) for i, (c, p) in enumerate(proposed)]
        if self.pool is None:
            for worker, cand, predicted in jobs:
                if self.stop.is_set():
                    return
                into.append(self.measurer.trial(cand, predicted, round_index, worker))
        else:
            into.extend(self.pool.map(
                lambda job: self.measurer.trial(job[1], job[2], round_index, job[0]), jobs))

    def close_round(self, whole: bool) -> None:
        """Learn from the round's correct trials and record the round (its rank correlations
        only when `whole`: every proposal measured)."""
        by_hash = {c.hash: c for c, _ in self.proposed}
        good = [t for t in self.done if t.correct and t.median_s]
        self.learn([(by_hash[t.program_hash], t) for t in good])
        predicted, times = [t.predicted_s for t in good], [t.median_s for t in good]
        best = self.result.best
        self.result.rounds.append(Round(
            self.round_index, list(self.done), spearman(predicted, times) if whole else None,
            kendall(predicted, times) if whole else None,
            best.gflops if best else None, time.perf_counter() - self.round_started))

    def remeasure_finalists(self) -> None:
        """The winner's curse: the fastest of many noisy timings is biased fast, and one
        timing can be 30% off (docs/ARCHITECTURE.md §17.5). The best few measured candidates
        are timed again side by side, in turn; the best re-measured median is the run's best,
        reported with that time."""
        settings = self.measurer.settings
        finalists = self.ranked[:settings.finalists]
        if not finalists:
            return
        self.say("finalists", {"finalists": len(finalists), "rounds": settings.final_rounds})
        measured = settings.measure_side_by_side([c.program for c in finalists],
                                                 on_timing=self.measurer.gate.on_timing)
        flops = self.measurer.naive.computation.flops
        timed = {c.hash: m.median_s for c, m in zip(finalists, measured)
                 if m.correct and m.median_s}
        self.result.finalists = [
            {"hash": c.hash, "in_run_gflops": flops / self.times_of[c.hash] / 1e9,
             "remeasured_gflops": flops / timed[c.hash] / 1e9 if c.hash in timed else None,
             "others_cores": m.others_cores,
             "error": m.error or (None if m.correct else m.check_message)}
            for c, m in zip(finalists, measured)]
        if not timed:
            return  # every re-measurement failed (e.g. a timeout): keep the rounds' best
        winner = min((c for c in finalists if c.hash in timed), key=lambda c: timed[c.hash])
        self.result.in_run_best_gflops = self.result.best.gflops
        self.result.best = self.trial_of(winner, timed[winner.hash])
        self.best = winner

    def trial_of(self, cand: Candidate | Baseline, median_s: float | None = None) -> Trial:
        """The run's correct trial of a measured candidate; with `median_s` (a re-measured
        time) in place of the one the rounds measured."""
        trial = next(t for t in self.result.trials if t.program_hash == cand.hash and t.correct)
        if median_s is None:
            return trial
        return replace(trial, median_s=median_s,
                       gflops=self.measurer.naive.computation.flops / median_s / 1e9)

    def learn(self, good: list[tuple[Candidate | Baseline, Trial]]) -> None:
        """The model, the best so far and the elites take in measured correct candidates."""
        self.model.update([c.program for c, _ in good], [t.median_s for _, t in good])
        for cand, t in good:
            if self.result.best is None or t.median_s < self.result.best.median_s:
                self.result.best, self.best = t, cand
        self.times_of.update((t.program_hash, t.median_s) for _, t in good)
        self.ranked = sorted([*self.ranked, *(c for c, _ in good)],
                             key=lambda c: self.times_of[c.hash])
        self.elites = [c for c in self.ranked if not isinstance(c, Baseline)]

    def report_round(self, finished: list[Trial]) -> None:
        last = self.result.rounds[-1]
        self.say("round", {"round": self.round_index, "trials": len(self.result.trials),
                           "of": self.budget.trials, "best_gflops": last.best_gflops,
                           "spearman": last.spearman,
                           "measured": sum(not t.cached for t in finished),
                           "contended": self.measurer.contended})

    def stop_measuring(self) -> None:
        """The round in flight ends after the measurement in progress."""
        self.stop.set()
        for executor in (self.pool, self.measuring):
            if executor is not None:
                executor.shutdown(cancel_futures=True)

    def finish_result(self) -> None:
        """The best program, its trace (checked: it rebuilds the measured program) and peak,
        and the wall time. A best whose trace rebuilds another program is passed over for the
        next measured candidate whose trace holds (`unreplayable` names it); with none left the
        run fails."""
        if self.best is not None:
            self.settle_on_replayable()
            program = self.best.program
            self.result.best_program = program
            parallel = has_parallel_loops(program)
            cores = self.measurer.settings.options().thread_count if parallel else 1
            self.result.peak_gflops = self.peak_gflops_per_core * cores
            self.result.best_trace = self.best.trace  # derived when it was measured, if it was
        self.result.wall_s = time.perf_counter() - self.budget.started

    def settle_on_replayable(self) -> None:
        remeasured = {f["hash"]: f["remeasured_gflops"] for f in self.result.finalists}
        order = [self.best, *sorted((c for c in self.ranked if c is not self.best),
                                    key=lambda c: -(remeasured.get(c.hash) or 0))]
        first_error: ExploreError | None = None
        for cand in order:
            try:
                _check_trace(self.measurer.naive, cand.trace, cand.hash)
            except ExploreError as err:
                first_error = first_error or err
                self.result.unreplayable.append(cand.hash)
                continue
            if cand is not self.best:
                gflops = remeasured.get(cand.hash)
                flops = self.measurer.naive.computation.flops
                self.best = cand
                self.result.best = self.trial_of(cand, flops / gflops / 1e9 if gflops else None)
            return
        assert first_error is not None
        raise first_error


def _first_clause(error: str) -> str:
    """An error's kind, as its message's first clause says it: "wrong result", "timed out
    after 120 s", "BackendError" (the runner names an exception by its type)."""
    return re.split(r": | \(", error, maxsplit=1)[0]


def _check_trace(naive: Program, trace: list[dict], measured_hash: str) -> None:
    """Raise an ExploreError unless `trace`, replayed on `naive`, gives the program of
    `measured_hash`: a reported trace must describe the program that was measured."""
    try:
        rebuilt = Schedule.replay(naive, trace).program.hash()
    except ScheduleError as err:
        raise ExploreError(f"the best program's trace does not replay ({err}); not "
                           f"reported") from None
    if rebuilt != measured_hash:
        raise ExploreError(f"the best program's trace rebuilds program {rebuilt}, not the "
                           f"measured {measured_hash}; not reported")


_SUMMARY = ("trials", "measured", "best_gflops", "best_median_s", "best_hash", "wall_s",
            "naive_median_s", "peak_gflops", "percent_of_peak", "speedup_over_naive", "space",
            "stop_reason", "finalists", "in_run_best_gflops")


def _summary(result: ExploreResult) -> dict[str, Any]:
    """What the database keeps of the result with the run."""
    return {k: v for k, v in result.to_json().items() if k in _SUMMARY}
