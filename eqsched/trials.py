"""How one candidate is measured: the settings of a run's measurements, the key under which a
measurement is stored and looked up in the database, and measuring or looking up one candidate.

    measurer = Measurer(database, "matmul", [64, 64, 64], naive, Settings(), run_id, TimingGate())
    trial = measurer.trial(candidate, predicted_s, round_index)   # a Trial, stored at once

A candidate is looked up in the database first (same workload, program, machine, target and
`Settings.outcome`: its stored measurement is used, nothing is run; a stored transient failure is
not used) and otherwise measured in a worker process
(`runner.measure`), checked against the numpy reference before it is timed, and stored at once
with its trace and target. A candidate whose trace cannot be derived is never run: it is recorded
as an error, since only replayable programs may be reported.

`TimingGate` counts the candidates being timed; a search that works inside its `searching()` and
calls its `wait_turn` between small units of work never runs while one is: a timing starts once
the unit in progress has ended (explore's search runs beside the measurements).

See docs/ARCHITECTURE.md §10 Exploration.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .backend import CompileOptions, Target, codegen
from .db import MEASUREMENT_SETTINGS, Database, Record
from .egraph.derive import DeriveError
from .egraph.term import Sizes
from .ir import LoopKind, Program
from .runner import (
    MAX_TIMEOUT_S,
    Measurement,
    check_max_memory,
    check_timeout,
    measure,
    measure_side_by_side,
)

if TYPE_CHECKING:
    from .extract.search import Candidate


BUSY_FOR_GOOD = 3
# Seeds are stored as SQLite integers (signed 64-bit); a negative one would be refused by numpy
# (input seeds) and read as its absolute value by `random.Random` (search seeds): -1 would
# repeat seed 1.
MAX_SEED = 2**63 - 1


def check_seed(seed: Any, what: str = "seed") -> int:
    """`seed` when it is an integer from 0 to MAX_SEED; otherwise a ValueError naming it."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"{what} must be an integer, got {seed!r}")
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"{what} must be from 0 to 2**63 - 1, got {seed}")
    return seed


@dataclass
class Settings:
    """How candidates are measured."""

    repeats: int = 10
    warmup: int = 1
    time_budget_s: float | None = 0.3  # per candidate: a slow one gets min_repeats timed runs
    min_repeats: int = 3  # one run on a busy machine can be far off (docs/ARCHITECTURE.md §17.5)
    timeout_s: float = 120.0  # per candidate: compile, check and timing together
    # The worker's memory cap in bytes (None: runner.default_max_memory(), half the machine's).
    max_memory: int | None = None
    input_seed: int = 0
    threads: int | None = None  # for parallel loops; None: every core (1: a one-core result)
    # What the code is compiled for, as `Target.parse` reads it ("host", "host,-avx512f",
    # "haswell", or a Target); kept as its normalized spec, which names it in the database.
    target: str = "host"
    # The winner's curse: the best of many noisy timings is biased fast. At the end of a run
    # the best `finalists` are timed again side by side, `final_rounds` times in turn, and the
    # best re-measured median wins (0: keep the best single measurement).
    finalists: int = 4
    final_rounds: int = 5
    # A timing during which other processes kept this many cores' worth busy is taken again
    # once (the quieter kept) and counted; None: never. Explore with several jobs adds the
    # other jobs' cores.
    contended_cores: float | None = 0.5

    def __post_init__(self) -> None:
        # A target LLVM does not know is refused here (TargetError), before anything runs; so
        # are a timeout or memory cap the worker cannot use (ValueError).
        self.target = Target.parse(self.target).spec
        self.timeout_s = check_timeout(self.timeout_s)
        check_seed(self.input_seed, "input seed")
        if self.max_memory is not None:
            check_max_memory(self.max_memory)
        if self.contended_cores is not None and not self.contended_cores > 0:
            raise ValueError(f"contended_cores must be more than 0, got {self.contended_cores}")
        if self.finalists < 0 or self.final_rounds < 1:
            raise ValueError(f"finalists must be >= 0 and final_rounds >= 1, got "
                             f"{self.finalists} and {self.final_rounds}")

    def options(self) -> CompileOptions:
        return CompileOptions(threads=self.threads, target=Target.parse(self.target))

    def outcome(self) -> dict[str, Any]:
        """What decides a measurement's outcome besides the target and the thread count: the
        settings `db.MEASUREMENT_SETTINGS` names and the code generator (`backend.codegen`).
        Stored with it, part of its lookup key: a new backend measures every program again."""
        return {**{name: getattr(self, name) for name in MEASUREMENT_SETTINGS},
                "codegen": codegen()}

    def for_naive(self) -> Settings:
        """How the naive program is measured (for the speedup): one timed run, no warmup."""
        return replace(self, repeats=1, warmup=0, min_repeats=1, time_budget_s=None)

    def lookup(self, database: Database, workload: str, size: list[int],
               key: str) -> Record | None:
        """The stored measurement under `key` (`measurement_key`) taken with these settings."""
        return database.lookup(workload, size, key, self.target, self.outcome())

    def measure_side_by_side(self, programs: list[Program],
                             on_timing: Callable[[bool], None] | None = None
                             ) -> list[Measurement]:
        """`runner.measure_side_by_side` of the finalists with these settings (each program
        gets the per-candidate timeout)."""
        return measure_side_by_side(
            programs, rounds=self.final_rounds, repeats=self.repeats, warmup=self.warmup,
            timeout_s=min(MAX_TIMEOUT_S, self.timeout_s * len(programs)),
            seed=self.input_seed, time_budget_s=self.time_budget_s,
            min_repeats=self.min_repeats, max_memory=self.max_memory,
            contended_cores=self.contended_cores, retimes=1, on_timing=on_timing,
            options=self.options())

    def measure(self, program: Program, *, worker: int = 0,
                on_timing: Callable[[bool], None] | None = None,
                contended_cores: float | None = None, retimes: int = 0) -> Measurement:
        """`runner.measure` of `program` with these settings (in worker process `worker`)."""
        return measure(program, repeats=self.repeats, warmup=self.warmup,
                       timeout_s=self.timeout_s, seed=self.input_seed,
                       time_budget_s=self.time_budget_s, min_repeats=self.min_repeats,
                       max_memory=self.max_memory, contended_cores=contended_cores,
                       retimes=retimes, worker=worker, on_timing=on_timing,
                       options=self.options())


def record_of(workload: str, size: list[int], key: str, structure: str, sizes: Sizes,
              trace: list[dict], m: Measurement, settings: Settings, **more: Any) -> Record:
    """The database record of a measurement with `settings` of the program of `structure` (a
    term shown in one line) and tile `sizes`, stored under `key` (`more`: the run's fields, like
    round and run_id); a wrong result is an error that says so."""
    error = m.error or (None if m.correct is not False else f"wrong result: {m.check_message}")
    return Record(
        workload=workload, size=list(size), program_hash=key, structure=structure,
        sizes={f"{g}|{p}": e for (g, p), e in sizes.items()}, trace=trace, times=m.times,
        median_s=m.median_s, gflops=m.gflops, correct=m.correct, error=error,
        error_kind=m.error_kind, target=settings.target, settings=settings.outcome(),
        others_cores=m.others_cores, load=m.load, **more)


def measurement_key(prog: Program, settings: Settings) -> str:
    """The program hash, plus the thread count when the program has parallel loops (its time
    depends on it)."""
    if has_parallel_loops(prog):
        return f"{prog.hash()}/threads={settings.options().thread_count}"
    return prog.hash()


def has_parallel_loops(prog: Program) -> bool:
    return any(lp.kind == LoopKind.PARALLEL for lp in prog.loops())


@dataclass(frozen=True)
class Baseline:
    """A program measured as a trial though no search proposed it (a task's default schedule),
    with the trace that builds it from the naive program. It is stored as a candidate is, its
    structure a word instead of a term and with no tile sizes: no term of the space describes
    it."""

    program: Program
    trace: list[dict]
    structure: str = "default"

    @property
    def hash(self) -> str:
        return self.program.hash()

    @property
    def sizes(self) -> Sizes:
        return {}


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


class TimingGate:
    """Keeps a search off the machine while candidates are timed: its memory traffic slows the
    timing, and unevenly (docs/ARCHITECTURE.md §17.5), and its CPU time would be taken for
    another process's (§11).

    A search runs its work inside `searching()` and calls `wait_turn` between small units of
    it, which blocks while any candidate is timed. `on_timing(True)`, the runner's callback
    before a timing starts, returns once every search is at a `wait_turn` or outside
    `searching()`: the unit a search is in when a timing is asked for runs to its end first,
    then the timing starts.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._timing = 0  # candidates being timed
        self._working = 0  # searches inside a unit of work
        self._mine = threading.local()  # whether this thread is one of them

    def on_timing(self, started: bool) -> None:
        """`runner.measure`'s callback: a timing starts (True) or has ended (False)."""
        with self._changed:
            self._timing += 1 if started else -1
            self._changed.notify_all()
            if started:  # a thread that searches and measures itself does not wait for itself
                self._changed.wait_for(lambda: self._working == self._in_unit())

    def wait_turn(self) -> bool:
        """Return once no candidate is being timed (between two units of a search's work)."""
        with self._changed:
            mine = self._in_unit()
            self._working -= mine
            self._changed.notify_all()
            try:
                self._changed.wait_for(lambda: self._timing == 0)
            finally:
                # Interrupted here (Ctrl-C while a candidate is timed), the search is still
                # inside `searching()`, whose exit counts it out: counted out twice, it would
                # leave every later timing waiting for a search that is not there.
                self._working += mine
        return True

    @contextlib.contextmanager
    def searching(self) -> Iterator[None]:
        """Around a search's work: from each `wait_turn` to the next, and from the start to the
        first and from the last to the end, it is a unit that a timing waits for."""
        if self._in_unit():
            raise RuntimeError("searching() does not nest")
        with self._changed:
            self._changed.wait_for(lambda: self._timing == 0)
            self._working += 1
            self._mine.working = 1
        try:
            yield
        finally:
            with self._changed:
                self._working -= 1
                self._mine.working = 0
                self._changed.notify_all()

    def _in_unit(self) -> int:
        return getattr(self._mine, "working", 0)


class Measurer:
    """Measures or looks up the candidates of one run (one workload at one size) and stores each
    measurement under the run's id."""

    def __init__(self, database: Database, workload: str, size: list[int], naive: Program,
                 settings: Settings, run_id: int | None, gate: TimingGate | None = None,
                 jobs: int = 1):
        self.database, self.workload, self.size = database, workload, list(size)
        self.naive, self.settings, self.run_id = naive, settings, run_id
        self.gate = gate or TimingGate()
        limit = settings.contended_cores
        # The run's other jobs time beside each one on purpose: their cores are not contention.
        self.contended_at = (None if limit is None
                             else limit + (jobs - 1) * settings.options().thread_count)
        self.contended = 0  # timings beside other processes that competed for the cores
        self.contended_in_a_row = 0

    def trial(self, cand: Candidate | Baseline, predicted_s: float, round_index: int,
              worker: int = 0) -> Trial:
        """The candidate's stored measurement, or a new one (in worker process `worker`),
        stored at once."""
        key = measurement_key(cand.program, self.settings)
        stored = self.settings.lookup(self.database, self.workload, self.size, key)
        if stored is not None:
            return Trial(round_index, cand.hash, cand.structure, predicted_s, stored.median_s,
                         stored.gflops, stored.correct, stored.error, cached=True)
        trace, m = self._measure(cand, worker)
        record = record_of(self.workload, self.size, key, cand.structure, cand.sizes, trace, m,
                           self.settings, predicted_s=predicted_s, round=round_index,
                           run_id=self.run_id)
        self.database.add(record)
        return Trial(round_index, cand.hash, record.structure, predicted_s, m.median_s, m.gflops,
                     m.correct, record.error, cached=False)

    def _measure(self, cand: Candidate | Baseline, worker: int
                 ) -> tuple[list[dict], Measurement]:
        """The candidate's trace and measurement; a candidate with no trace is not run."""
        try:
            trace = cand.trace
        except DeriveError as err:
            # Only replayable programs may be reported; this one is recorded as an error.
            return [], Measurement(correct=None, error=f"no replayable trace: {err}")
        # On a machine busy for good, timing again only costs time: after BUSY_FOR_GOOD
        # contended timings in a row, timings are taken once (and still counted) until a
        # quiet one.
        retimes = 0 if self.contended_in_a_row >= BUSY_FOR_GOOD else 1
        m = self.settings.measure(cand.program, worker=worker, on_timing=self.gate.on_timing,
                                  contended_cores=self.contended_at, retimes=retimes)
        if m.others_cores is not None and self.contended_at is not None:
            contended = m.others_cores >= self.contended_at
            self.contended += contended or m.retimed > 0
            self.contended_in_a_row = self.contended_in_a_row + 1 if contended else 0
        return trace, m

    def naive_median_s(self) -> float | None:
        """The naive program's median time (for the speedup), measured once per machine and
        target."""
        naive = self.settings.for_naive()
        stored = naive.lookup(self.database, self.workload, self.size, self.naive.hash())
        if stored is None:
            m = naive.measure(self.naive)
            stored = Record(workload=self.workload, size=list(self.size),
                            program_hash=self.naive.hash(), structure="naive", sizes={}, trace=[],
                            times=m.times, median_s=m.median_s, gflops=m.gflops,
                            correct=m.correct, error=m.error,
                            error_kind=m.error_kind, run_id=self.run_id,
                            target=naive.target, settings=naive.outcome())
            self.database.add(stored)
        return stored.median_s if stored.correct else None
