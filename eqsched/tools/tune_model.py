"""Tune a whole model under one trial budget and run it end to end (`eqsched tune-model`).

    eqsched tune-model mlp --trials 200                       # a built-in model
    eqsched tune-model mlp --param batch=64 --json
    eqsched tune-model model.onnx --scheduler round-robin --threads 2

    result = tune_model(get_model("bert_layer"), trials=1000, db="eqsched.db")
    result.latency_s, result.correct, result.tasks

The model is partitioned into tasks (`model.tasks.extract_tasks`: a reduction with what is fused
into it, structurally equal tasks counted once with a weight), the task scheduler spends the
global budget across them (`task_tuning.tune_tasks`), and the tuned kernels, taken from the
database, are composed into one `CompiledModel`, checked end to end against the numpy evaluation
of the graph (and against onnxruntime for an ONNX model, when it is installed) and timed. A
re-run on the same database measures nothing it measured before. The model is also compiled with
every task's default schedule and, after tuning, both are timed in alternating rounds, end to end
and each task's kernel alone, so the result says what tuning bought on one machine state.

Each call is recorded in the database as a model run (`Database.start_model_run`): the model's
name and graph fingerprint, the settings, machine and versions, the tuning curve (after each
slice: trials so far, the task tuned, each task's best latency and the scheduler's objective),
the end-to-end latencies and check, and per task its key, weight, FLOPs, trials, kernel times
before and after and where its kernel came from. A re-run records a second run; an interrupted
one is recorded `interrupted` with what it got to. `eqsched report` gives each model a page.

See docs/ARCHITECTURE.md §19 Tasks and compiled models.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..args import TARGET_HELP, CliError, early_stopping_arg, resumable_interrupt, seed_arg
from ..backend import CompileOptions
from ..backend.target import Target, TargetError
from ..model import Model, ModelError
from ..task_scheduler import EARLY_STOPPING

if TYPE_CHECKING:
    from ..compiled_model import CompiledModel
    from ..db import Database
    from ..model.tasks import ModelTask
    from ..trials import Settings

TIMED_CALLS = 20  # end-to-end calls whose median is the model's latency


@dataclass
class ModelTuningResult:
    """What `tune_model` did: the model's end-to-end latency (median seconds) with its default
    schedules and after tuning, the end-to-end checks, each task's row of the scheduler's table
    (name, weight, FLOPs, trials, best GFLOPS, latency) with its database key, where its kernel
    came from and its kernel's time alone before and after tuning, the tuning curve (a point
    after each slice: trials so far, the task tuned, each task's best latency and the
    scheduler's objective), and the id of the model run recorded in the database."""

    model: str
    scheduler: str
    trials: int
    measured: int
    latency_s: float
    default_latency_s: float
    correct: bool
    check: str
    onnxruntime: str | None
    tasks: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False
    curve: list[dict[str, Any]] = field(default_factory=list)
    run_id: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "scheduler": self.scheduler, "trials": self.trials,
                "measured": self.measured, "latency_s": self.latency_s,
                "default_latency_s": self.default_latency_s, "correct": self.correct,
                "check": self.check, "onnxruntime": self.onnxruntime,
                "interrupted": self.interrupted, "tasks": self.tasks, "curve": self.curve,
                "run_id": self.run_id}


def load_model(spec: str, params: dict[str, int] | None = None) -> Model:
    """A built-in model by name (with its size `params`), or an ONNX file (a path ending in
    .onnx). ModelError names what is wrong."""
    from ..model import get_model
    from ..model.onnx_import import import_onnx

    if spec.endswith(".onnx"):
        if params:
            raise ModelError(f"{spec}: --param sets a built-in model's sizes; an ONNX file's "
                             "shapes are its own")
        if not Path(spec).is_file():
            raise ModelError(f"{spec}: no such file")
        return import_onnx(spec)
    return get_model(spec, **(params or {}))


def model_fingerprint(model: Model) -> str:
    """A short hash of what a model's tuning depends on, so that two models of one name are never
    taken for one: its graph as `str(model)` lists it (inputs, weights' shapes, nodes with their
    operators' attributes and shapes, outputs) and its one-element weights' values, which tasks
    fold into their kernels. Other weights' values change no kernel and no time."""
    scalars = {k: float(w.reshape(-1)[0]) for k, w in sorted(model.weights.items())
               if w.size == 1}
    text = f"{model}\n{json.dumps(scalars, sort_keys=True)}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def conv_algorithm(model: Model) -> str:
    """How the model's convolutions compute: "winograd" when `model.winograd.winograd` rewrote
    some, else "direct"."""
    return ("winograd" if any(n.op.op_type == "WinogradOutput" for n in model.nodes)
            else "direct")


def tune_model(model: Model, trials: int, *, scheduler: str = "gradient",
               db: str | Path = "eqsched.db", seed: int = 0, threads: int | None = None,
               target: str | None = None, population: int | None = None,
               early_stopping: int | None = EARLY_STOPPING,
               onnx_source: str | Path | None = None, progress: Any = None) -> ModelTuningResult:
    """Tune `model`'s tasks for `trials` in all and compile, check and time it end to end (see
    the module docstring), recorded in the database as a model run. `early_stopping`: trials
    without a gain after which a task is done (None: every task goes on until the budget is
    spent). `onnx_source`: the file an imported model came from, which onnxruntime runs for the
    second check."""
    from ..db import Database, DatabaseError, workload_key
    from ..explore import POPULATION, check_population, computation_key
    from ..machine_model import describe
    from ..model.tasks import extract_tasks
    from ..task_scheduler import get_scheduler
    from ..trials import Settings, check_seed

    settings = Settings(threads=threads, target=target or "host")
    options = CompileOptions(threads=settings.options().thread_count,
                             target=Target.parse(settings.target))
    population = POPULATION if population is None else population
    # Bad settings are refused before a run is recorded: it would only be a failed one.
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    if early_stopping is not None and early_stopping < 1:
        raise ValueError(f"early_stopping must be >= 1 or None, got {early_stopping}")
    get_scheduler(scheduler, seed)
    check_population(population)
    check_seed(seed)
    model_tasks = extract_tasks(model)
    facts = describe(options.target)
    with Database(db) as database:
        run_id = database.start_model_run(
            model=model.name, fingerprint=model_fingerprint(model),
            settings={"scheduler": scheduler, "trials": trials, "seed": seed,
                      "threads": options.thread_count, "target": options.target.spec,
                      "population": population, "early_stopping": early_stopping,
                      "conv": conv_algorithm(model)},
            machine=facts, versions=facts.get("versions", {}))
        # Filled in as the run goes, so an interrupted or failed run records what it got to.
        summary: dict[str, Any] = {
            "curve": [], "tasks": [{"name": t.name, "key": workload_key(
                *computation_key(t.computation)), "weight": t.weight, "flops": t.flops}
                for t in model_tasks]}
        try:
            result = _tune_and_run(model, model_tasks, trials, summary, database,
                                   options=options, settings=settings, scheduler=scheduler,
                                   seed=seed, population=population,
                                   early_stopping=early_stopping, onnx_source=onnx_source,
                                   progress=progress)
        except BaseException as err:
            interrupted = isinstance(err, KeyboardInterrupt)
            if not interrupted:
                summary["error"] = f"{type(err).__name__}: {err}".splitlines()[0]
            # The error being raised is the one to report, not a failure to record it.
            with contextlib.suppress(DatabaseError):
                database.finish_model_run(run_id, status="interrupted" if interrupted
                                          else "failed", summary=summary)
            raise
        database.finish_model_run(run_id, status="interrupted" if result.interrupted
                                  else "done", summary=summary)
    result.run_id = run_id
    return result


def _tune_and_run(model: Model, model_tasks: list[ModelTask], trials: int,
                  summary: dict[str, Any], database: Database, *, options: CompileOptions,
                  settings: Settings, scheduler: str,
                  seed: int, population: int, early_stopping: int | None,
                  onnx_source: str | Path | None, progress: Any) -> ModelTuningResult:
    """`tune_model`'s work on an open database, writing what it measures into `summary` (its
    task rows, in the tasks' order, and the curve) as it goes."""
    from ..compiled_model import CompiledModel
    from ..task_tuning import Task, tune_tasks

    rows = summary["tasks"]

    def recording(event: str, data: dict[str, Any]) -> None:
        if event == "tasks":
            best = [row["latency_s"] for row in data["rows"]]
            weighted = [row["weighted_latency_s"] for row in data["rows"]]
            summary["curve"].append({
                "trials": data["trials"], "task": data["task"], "best_s": best,
                "objective_s": None if None in weighted else sum(weighted)})
        if progress is not None:
            progress(event, data)

    default = CompiledModel(model, options=options, tasks=model_tasks)
    tuned = tune_tasks([Task(t.name, t.computation, t.weight) for t in model_tasks], trials,
                       scheduler=scheduler, db=database, seed=seed, settings=settings,
                       population=population, early_stopping=early_stopping,
                       progress=recording)
    for row, table_row in zip(rows, tuned.tasks):
        row.update({k: table_row[k] for k in ("trials", "best_gflops", "latency_s",
                                              "weighted_latency_s", "done")})
    summary["objective_s"] = tuned.objective_s
    compiled = CompiledModel(model, db=database, options=options, tasks=model_tasks)
    verdict = compiled.check(seed=seed)
    against_ort = compiled.check_onnxruntime(onnx_source, seed=seed)
    (default_latency, latency), (default_kernel_s, tuned_kernel_s) = _side_by_side(default,
                                                                                    compiled)
    summary["default_latency_s"] = default_latency
    for row in rows:
        row["kernel"] = compiled.kernels[row["name"]].source
        row["default_kernel_s"] = default_kernel_s[row["name"]]
        row["tuned_kernel_s"] = tuned_kernel_s[row["name"]]
    correct = bool(verdict) and against_ort.correct is not False
    result = ModelTuningResult(model.name, tuned.scheduler, tuned.trials, tuned.measured,
                               latency, default_latency, correct, verdict.message,
                               against_ort.message, rows, tuned.interrupted, summary["curve"])
    summary.update({k: v for k, v in result.to_json().items() if k not in ("tasks", "curve",
                                                                             "run_id")})
    return result


def _side_by_side(*models: CompiledModel, rounds: int = 4
                  ) -> tuple[list[float], list[dict[str, float]]]:
    """Each model's end-to-end latency and its kernels' times alone, timed in alternating
    rounds (a median of the rounds' medians), so that before and after tuning see the same
    machine: timed minutes apart, a busy machine's drift reads as a change of program."""
    calls = max(1, TIMED_CALLS // rounds)
    latencies: list[list[float]] = [[] for _ in models]
    kernels: list[list[dict[str, float]]] = [[] for _ in models]
    for _ in range(rounds):
        for model, latency, kernel in zip(models, latencies, kernels):
            latency.append(model.time(calls))
            kernel.append(model.time_tasks(calls))
    return ([statistics.median(times) for times in latencies],
            [{name: statistics.median(r[name] for r in rounds_) for name in rounds_[0]}
             for rounds_ in kernels])


# ---- the command ------------------------------------------------------------------------------


def _param(text: str) -> tuple[str, int]:
    name, eq, value = text.partition("=")
    if not eq or not name or not value.strip().isdigit():
        raise ValueError(f"--param takes NAME=INTEGER, like batch=64, got {text!r}")
    return name.strip(), int(value)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("tune-model", help="tune a model's tasks under one budget and run it end "
                                          "to end")
    p.add_argument("model", help="a built-in model (mlp, bert_layer, resnet_block) or an .onnx "
                                 "file")
    p.add_argument("--param", action="append", default=[], metavar="NAME=N",
                   help="a built-in model's size, like batch=64 (repeatable)")
    p.add_argument("--trials", type=int, default=200, help="trials across all tasks (default "
                                                          "200)")
    p.add_argument("--scheduler", default="gradient", help="gradient (Ansor's, default) or "
                                                          "round-robin")
    p.add_argument("--db", default="eqsched.db", help="results database (default eqsched.db)")
    p.add_argument("--seed", type=seed_arg, default=0, help="search seed (default 0)")
    p.add_argument("--threads", type=int, help="threads per kernel (default: every core)")
    p.add_argument("--target", default="host", help=TARGET_HELP)
    p.add_argument("--population", type=int,
                   help="candidates each task's search evolves a round (default: the search's)")
    p.add_argument("--early-stopping", type=early_stopping_arg, default=EARLY_STOPPING,
                   metavar="N|off", help="a task is done after N trials without a gain; off "
                   "(the default): every task goes on until --trials are spent")
    p.add_argument("--conv", choices=("direct", "winograd"), default="direct",
                   help="how 3x3 stride-1 convolutions compute: direct (default) or winograd "
                   "(F(2x2, 3x3): fewer multiplications, the transforms in the same task)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object on stdout (progress goes to stderr)")
    p.set_defaults(run=_cmd_tune_model)


def _cmd_tune_model(args: Any) -> int:
    from ..db import DatabaseError
    from ..model.winograd import winograd
    from ..task_scheduler import SchedulerError, get_scheduler

    if args.trials < 1:
        raise CliError(f"--trials must be >= 1, got {args.trials}")
    if args.threads is not None and args.threads < 1:
        raise CliError(f"--threads must be >= 1, got {args.threads}")
    if args.population is not None and args.population < 2:
        raise CliError(f"--population must be >= 2, got {args.population}")
    try:
        Target.parse(args.target).check_runs_here()
        get_scheduler(args.scheduler)
        params = dict(_param(p) for p in args.param)
        model = load_model(args.model, params)
        if args.conv == "winograd":
            model = winograd(model)
    except (ValueError, TargetError, SchedulerError) as err:  # ModelError is a ValueError
        raise CliError(str(err)) from None

    def show(event: str, data: dict[str, Any]) -> None:
        if event == "tasks":
            print(f"eqsched: {data['trials']}/{data['of']} trials, round {data['round']} "
                  f"({data['task']}):\n{data['table']}", file=sys.stderr, flush=True)
        elif event == "saturating":
            print(f"eqsched: saturating the space of task {data.get('task', data['workload'])}",
                  file=sys.stderr, flush=True)
        elif event == "saturated" and data["stop_reason"] == "time_limit":
            from ..explore import time_limited

            print(f"eqsched: warning: task {data.get('task', data['workload'])}: "
                  f"{time_limited(data)}", file=sys.stderr, flush=True)

    try:
        result = tune_model(model, args.trials, scheduler=args.scheduler, db=args.db,
                            seed=args.seed, threads=args.threads, target=args.target,
                            population=args.population, early_stopping=args.early_stopping,
                            onnx_source=args.model if args.model.endswith(".onnx") else None,
                            progress=show)
    except (DatabaseError, SchedulerError) as err:
        raise CliError(str(err)) from None
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print(f"{result.model}: {result.latency_s * 1e3:.3f} ms end to end after "
              f"{result.trials} trials ({result.measured} measured now), "
              f"{result.default_latency_s * 1e3:.3f} ms with default schedules; "
              f"{result.check}" + (f"; {result.onnxruntime}" if result.onnxruntime else "")
              + f"; recorded as model run {result.run_id} in {args.db}")
    if result.interrupted:
        return resumable_interrupt()
    return 0 if result.correct else 1
