"""Tuning the tasks of a model under one trial budget: a task scheduler picks which task gets the
next slice of trials, each task's exploration goes on where its last slice stopped.

    tasks = [Task("dense", dense_computation, weight=2), Task("softmax", softmax_computation)]
    result = tune_tasks(tasks, trials=256, scheduler="gradient", db="eqsched.db")
    result.objective_s, result.tasks      # sum of weight x best latency; the table, as data
    print(format_table(result.tasks))

A task is a `te.Computation` made at run time (a fused subgraph of a model) with a weight (how
many times the model runs it); it is explored by an `explore.TaskTuner`, which saturates once and
is stepped `slice_trials` at a time (searching a slice's next round while its last is
measured, as between two rounds of one slice: a slice would otherwise wait for its first round's
search), and stored under `explore.computation_key` (its name and its
naive program's hash), so two different computations of one name never share measurements and a
task measured once is looked up, never measured again. A task's first trial is its default
schedule (`default_schedule`, what a compiled model runs for a task never tuned), so its best is
never slower than that. The measuring worker needs no registry: each program carries its
computation, from which the worker builds the reference.

The loop, the same for every scheduler: ask the scheduler for a task (`task_scheduler`), tune it for
one slice, record its best latency, then drop it when it has no valid program (its row says why: the
commonest error of its trials), when its space has nothing untried left, or when `early_stopping`
trials in a row did not improve it (per-task early stopping). After each slice the progress callback
gets the table (`"tasks"` event: ID, name, FLOPs, weight, best GFLOPS, latency, weighted latency,
trials, done). When the rounds end, each task's finalists are timed again (`TaskTuner.close`) and
the table is final. Deterministic given the seed and the database's measurements: a re-run on the
same database measures nothing new and makes the same choices.

See docs/ARCHITECTURE.md §21 Task scheduling.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .backend import Target
from .db import Database
from .egraph.saturate import Limits, SaturationError
from .explore import DEFAULT_DB, POPULATION, ExploreResult, Progress, TaskTuner, check_population
from .expr import to_str
from .extract import CostModel
from .task_scheduler import (
    EARLY_STOPPING,
    SchedulerError,
    TaskScheduler,
    TaskState,
    get_scheduler,
)
from .te import Computation
from .trials import Settings, check_seed

if TYPE_CHECKING:
    from .rules import Spec as RuleSpec

__all__ = ["Task", "TaskTuningResult", "Tunable", "format_table", "run_rounds", "signature",
           "table", "tune_tasks"]


@dataclass(frozen=True)
class Task:
    """One computation of a model to tune, and how many times the model runs it."""

    name: str
    computation: Computation
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a task needs a name")
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) \
                or not 0 < self.weight < math.inf:
            raise ValueError(f"task {self.name}: weight must be more than 0 and finite, got "
                             f"{self.weight!r}")


_NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*")  # a name, not the exponent of 1e-05


def signature(comp: Computation) -> str:
    """What tasks of one structure at different shapes share (the gradient rule's similar
    tasks): each input's rank and each stage's ranks, reducer and body, with buffers and axes
    named by position and extents left out (index constants, such as a stride, stay)."""
    names: dict[str, str] = {}
    for t in comp.inputs:
        names[t.name] = f"in{len(names)}"
    lines = [" ".join(f"{names[t.name]}/{len(t.shape)}" for t in comp.inputs)]
    for stage in comp.stages:
        names[stage.name] = f"s{len(names)}"
        axes = {a.name: f"a{n}" for n, a in enumerate(stage.axes)}
        body = _NAME.sub(lambda m: axes.get(m[0], names.get(m[0], m[0])), to_str(stage.body))
        lines.append(f"{names[stage.name]} {len(stage.spatial)} {len(stage.reduce_axes)} "
                     f"{stage.reduce or '='} {body}")
    lines.append(" ".join(names[o] for o in comp.outputs))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]


@dataclass
class TaskTuningResult:
    """What `tune_tasks` did: the final table (one dict per task, `format_table` prints it), the
    task given each round, each task's exploration (None for a task never given a round), and
    the objective: the sum of weight x best latency over tasks with a valid program."""

    scheduler: str
    budget: int
    tasks: list[dict[str, Any]]
    order: list[int] = field(default_factory=list)
    results: list[ExploreResult | None] = field(default_factory=list)
    interrupted: bool = False

    @property
    def trials(self) -> int:
        return sum(row["trials"] for row in self.tasks)

    @property
    def measured(self) -> int:
        """Trials measured by this call (not found in the database)."""
        return sum(r.measured for r in self.results if r is not None)

    @property
    def objective_s(self) -> float | None:
        """Sum of weight x best latency; None unless every task has a valid program."""
        weighted = [row["weighted_latency_s"] for row in self.tasks]
        return None if any(w is None for w in weighted) else sum(weighted)

    def to_json(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler, "budget": self.budget, "trials": self.trials,
                "measured": self.measured, "objective_s": self.objective_s,
                "interrupted": self.interrupted, "order": self.order, "tasks": self.tasks}


def table(states: Sequence[TaskState], best_s: dict[int, float | None] | None = None
          ) -> list[dict[str, Any]]:
    """One row per task: id, name, FLOPs, weight, best GFLOPS, latency and weighted latency (s),
    trials, and why it is done ("" while it is not). `best_s` overrides a task's latency (the
    finalists' re-measured time)."""
    rows = []
    for s in states:
        best = s.best_s if best_s is None or s.id not in best_s else best_s[s.id]
        rows.append({"id": s.id, "name": s.name, "flops": s.flops, "weight": s.weight,
                     "best_gflops": s.flops / best / 1e9 if best else None, "latency_s": best,
                     "weighted_latency_s": s.weight * best if best else None,
                     "trials": s.trials, "done": s.done})
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The table as text, MetaSchedule's columns (latencies in microseconds), and a total line."""
    head = ("ID", "Name", "FLOP", "Weight", "GFLOPS", "Latency (us)", "Weighted (us)", "Trials",
            "Done")

    def us(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1e6:.2f}"

    body = [(str(r["id"]), r["name"], str(r["flops"]), f"{r['weight']:g}",
             "-" if r["best_gflops"] is None else f"{r['best_gflops']:.2f}", us(r["latency_s"]),
             us(r["weighted_latency_s"]), str(r["trials"]), r["done"] or "")
            for r in rows]
    widths = [max(len(x) for x in column) for column in zip(head, *body)]
    lines = [" | ".join(x.rjust(w) for x, w in zip(line, widths)) for line in (head, *body)]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    weighted = [r["weighted_latency_s"] for r in rows]
    total = ("-" if any(w is None for w in weighted) else us(sum(weighted)))
    lines.append(f"Total trials: {sum(r['trials'] for r in rows)}; total weighted latency: "
                 f"{total} us")
    return "\n".join(lines)


def tune_tasks(tasks: Sequence[Task], trials: int, *,
               scheduler: str | TaskScheduler = "gradient", slice_trials: int = 16,
               early_stopping: int | None = EARLY_STOPPING,
               db: str | Path | Database = DEFAULT_DB,
               seed: int = 0, cost_model: str | CostModel = "learned", rules: RuleSpec = None,
               limits: Limits | None = None, jobs: int = 1, population: int = POPULATION,
               settings: Settings | None = None, target: str | Target | None = None,
               progress: Progress | None = None) -> TaskTuningResult:
    """Spend `trials` across `tasks`, `slice_trials` at a time, where `scheduler` (a name of
    `task_scheduler.SCHEDULERS` or an object) says; see the module docstring. Each task's
    exploration takes `seed`, `cost_model`, `rules`, `limits`, `jobs`, `settings` and `target`
    as `explore` does (a cost model given by name is made for each task, an object is shared by
    all); `early_stopping`: trials without improvement after which a task is done (None:
    never)."""
    if not tasks:
        raise ValueError("no tasks to tune")
    if trials < 1 or slice_trials < 1:
        raise ValueError(f"trials and slice_trials must be >= 1, got {trials}, {slice_trials}")
    if early_stopping is not None and early_stopping < 1:
        raise ValueError(f"early_stopping must be >= 1 or None, got {early_stopping}")
    check_population(population)  # before the database is opened
    check_seed(seed)
    chosen = get_scheduler(scheduler, seed)
    say = progress or (lambda event, data: None)
    states = [TaskState(i, t.name, float(t.weight), t.computation.flops,
                        signature(t.computation)) for i, t in enumerate(tasks)]
    database = db if isinstance(db, Database) else Database(db)
    tuners: dict[int, TaskTuner] = {}
    result = TaskTuningResult(chosen.name, trials, [])

    def tuner_of(i: int) -> TaskTuner:
        if i not in tuners:
            name = tasks[i].name
            tuners[i] = TaskTuner(
                tasks[i].computation, db=database, seed=seed, cost_model=cost_model,
                rules=rules, limits=limits, batch=slice_trials, jobs=jobs,
                population=population, settings=settings,
                target=target, measure_naive=False, measure_default=True,
                progress=lambda event, data: say(event, {**data, "task": name}),
                related=[t.computation for j, t in enumerate(tasks) if j != i],
                search_ahead=True)
        return tuners[i]

    try:
        result.order, result.interrupted = run_rounds(
            states, tuner_of, chosen, trials, slice_trials=slice_trials,
            early_stopping=early_stopping, progress=say)
    except BaseException:
        # The rounds were cut short (a scheduler's bad pick, a full disk): every task's run
        # ends as an interrupted one would, without finalists, and a re-run resumes it.
        result.interrupted = True
        raise
    finally:
        if result.interrupted:
            for tuner in tuners.values():
                tuner.result.interrupted, tuner.result.stop_reason = True, "interrupted"
        try:
            result.results = _close_all(tuners, len(tasks))
        finally:
            if not isinstance(db, Database):
                database.close()
    remeasured = {i: r.best.median_s for i, r in enumerate(result.results)
                  if r is not None and r.best is not None}
    result.tasks = table(states, remeasured)
    return result


class Tunable(Protocol):
    """What `run_rounds` steps: a `TaskTuner`, or a test's synthetic latency curve."""

    @property
    def trials_taken(self) -> int: ...

    @property
    def exhausted(self) -> bool: ...

    @property
    def interrupted(self) -> bool: ...

    @property
    def stop_reason(self) -> str: ...

    @property
    def failure(self) -> str: ...

    def tune(self, trials: int) -> float | None: ...


def run_rounds(states: Sequence[TaskState], tuner_of: Callable[[int], Tunable],
               scheduler: TaskScheduler, trials: int, *, slice_trials: int = 16,
               early_stopping: int | None = EARLY_STOPPING, progress: Progress | None = None
               ) -> tuple[list[int], bool]:
    """The rounds of `tune_tasks` over `states` (updated in place): `scheduler` picks a task,
    `tuner_of(id)` tunes it for a slice, the loop records its best latency and says whether it
    is done, until `trials` are spent or no task is left. Returns the task of each round and
    whether an interrupt ended them."""
    say = progress or (lambda event, data: None)
    stale = [0] * len(states)  # trials since each task's best last improved
    order: list[int] = []
    spent = 0
    try:
        while spent < trials and any(not s.done for s in states):
            i = scheduler.next_task(states)
            if not 0 <= i < len(states) or states[i].done:
                raise SchedulerError(f"task scheduler {scheduler.name} chose task {i}, which "
                                     f"is not a task left to tune")
            state, before = states[i], states[i].best_s
            order.append(i)
            tuner = tuner_of(i)
            taken, failed = tuner.trials_taken, ""
            try:
                best = tuner.tune(min(slice_trials, trials - spent))
            except SaturationError as err:  # this task's space cannot be built: drop it
                best, failed = None, f"failed: {err}".splitlines()[0]
            got = tuner.trials_taken - taken
            spent += got
            state.trials += got
            state.history.append(best)
            if tuner.interrupted:
                return order, True
            improved = best is not None and (before is None or best < before)
            stale[i] = 0 if improved else stale[i] + got
            state.done = failed or _why_done(tuner, best, stale[i], early_stopping)
            rows = table(states)
            say("tasks", {"round": len(order) - 1, "task": state.name, "trials": spent,
                          "of": trials, "rows": rows, "table": format_table(rows)})
    except KeyboardInterrupt:
        return order, True
    return order, False


def _close_all(tuners: dict[int, TaskTuner], count: int) -> list[ExploreResult | None]:
    """Every tuner's result once closed (finalists, checked trace, run status), None for a task
    never tuned. A close that fails (a best whose trace does not replay) does not keep the
    others from closing; the first such error is raised after."""
    results: list[ExploreResult | None] = [None] * count
    first: Exception | None = None
    for i, tuner in sorted(tuners.items()):
        try:
            results[i] = tuner.close()
        except Exception as err:
            first = first or err
    if first is not None:
        raise first
    return results


def _why_done(tuner: Tunable, best: float | None, stale: int,
              early_stopping: int | None) -> str:
    """Why a task gets no more trials after its last slice ("" when it may have more)."""
    if best is None:
        return f"no valid program: {tuner.failure}" if tuner.failure else "no valid program"
    if tuner.exhausted:
        return tuner.stop_reason or "nothing untried left"
    if early_stopping is not None and stale >= early_stopping:
        return f"no gain in {stale} trials"
    return ""
