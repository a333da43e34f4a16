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
re-run on the same database measures nothing it measured before. Before tuning, the model is
compiled and timed once with every task's default schedule, so the result says what tuning bought.

See docs/ARCHITECTURE.md §19 Tasks and compiled models.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..args import TARGET_HELP, CliError, seed_arg
from ..backend import CompileOptions
from ..backend.target import Target, TargetError
from ..model import Model, ModelError

TIMED_CALLS = 20  # end-to-end calls whose median is the model's latency


@dataclass
class ModelTuningResult:
    """What `tune_model` did: the model's end-to-end latency (median seconds) with its default
    schedules and after tuning, the end-to-end checks, and each task's row of the scheduler's
    table (name, weight, trials, best GFLOPS, latency), plus where its kernel came from."""

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

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "scheduler": self.scheduler, "trials": self.trials,
                "measured": self.measured, "latency_s": self.latency_s,
                "default_latency_s": self.default_latency_s, "correct": self.correct,
                "check": self.check, "onnxruntime": self.onnxruntime,
                "interrupted": self.interrupted, "tasks": self.tasks}


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


def tune_model(model: Model, trials: int, *, scheduler: str = "gradient",
               db: str | Path = "eqsched.db", seed: int = 0, threads: int | None = None,
               target: str | None = None, population: int | None = None,
               onnx_source: str | Path | None = None, progress: Any = None) -> ModelTuningResult:
    """Tune `model`'s tasks for `trials` in all and compile, check and time it end to end (see
    the module docstring). `onnx_source`: the file an imported model came from, which
    onnxruntime runs for the second check."""
    from ..compiled_model import CompiledModel
    from ..model.tasks import extract_tasks
    from ..task_tuning import Task, tune_tasks
    from ..trials import Settings

    settings = Settings(threads=threads, target=target or "host")
    options = CompileOptions(threads=settings.options().thread_count,
                             target=Target.parse(settings.target))
    model_tasks = extract_tasks(model)
    default = CompiledModel(model, options=options, tasks=model_tasks)
    default_latency = default.time(TIMED_CALLS)
    tuned = tune_tasks([Task(t.name, t.computation, t.weight) for t in model_tasks], trials,
                       scheduler=scheduler, db=db, seed=seed, settings=settings,
                       progress=progress,
                       **({} if population is None else {"population": population}))
    compiled = CompiledModel(model, db=db, options=options, tasks=model_tasks)
    verdict = compiled.check(seed=seed)
    against_ort = compiled.check_onnxruntime(onnx_source, seed=seed)
    sources = {k.task.name: k.source for k in compiled.kernels.values()}
    rows = [{"name": row["name"], "weight": row["weight"], "flops": row["flops"],
             "trials": row["trials"], "best_gflops": row["best_gflops"],
             "latency_s": row["latency_s"], "weighted_latency_s": row["weighted_latency_s"],
             "done": row["done"], "kernel": sources.get(row["name"])} for row in tuned.tasks]
    correct = bool(verdict) and against_ort.correct is not False
    return ModelTuningResult(model.name, tuned.scheduler, tuned.trials, tuned.measured,
                             compiled.time(TIMED_CALLS), default_latency, correct,
                             verdict.message, against_ort.message, rows, tuned.interrupted)


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
    p.add_argument("--json", action="store_true",
                   help="print one JSON object on stdout (progress goes to stderr)")
    p.set_defaults(run=_cmd_tune_model)


def _cmd_tune_model(args: Any) -> int:
    from ..db import DatabaseError
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
    except (ValueError, TargetError, SchedulerError) as err:  # ModelError is a ValueError
        raise CliError(str(err)) from None

    def show(event: str, data: dict[str, Any]) -> None:
        if event == "tasks":
            print(f"eqsched: {data['trials']}/{data['of']} trials, round {data['round']} "
                  f"({data['task']}):\n{data['table']}", file=sys.stderr, flush=True)
        elif event == "saturating":
            print(f"eqsched: saturating the space of task {data.get('task', data['workload'])}",
                  file=sys.stderr, flush=True)

    try:
        result = tune_model(model, args.trials, scheduler=args.scheduler, db=args.db,
                            seed=args.seed, threads=args.threads, target=args.target,
                            population=args.population,
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
              f"{result.check}" + (f"; {result.onnxruntime}" if result.onnxruntime else ""))
    return 0 if result.correct else 1
