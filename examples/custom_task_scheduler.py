"""A task scheduler of your own: one class, one method, registered under a name and used by
`tune_tasks` like the built-in ones, beside Ansor's gradient rule.

    python examples/custom_task_scheduler.py            # three tasks, 96 trials each way
    python examples/custom_task_scheduler.py --small    # two tiny tasks, under a minute

The tasks are computations written here with `eqsched.te`, as a model's partition would make
them (registered as no workload): two dense layers of one structure at two widths, a heavy one
run four times per inference, and a row normalization (the small run keeps the first and the
last). The scheduler here gives every slice to the task of
the largest weighted latency, with no warm-up beyond one round each. Each scheduler tunes into a
database of its own, and the script prints the final table of each and the objective, the sum of
weight x best latency.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from eqsched.explore import Settings
from eqsched.expr import relu
from eqsched.task_scheduler import TaskScheduler, TaskState, register
from eqsched.task_tuning import Task, format_table, tune_tasks
from eqsched.te import Computation, compute, placeholder, reduce_axis, sum_


@register
class HeaviestFirst(TaskScheduler):
    """Each task once, then always the task that costs the model the most."""

    name = "heaviest-first"

    def next_task(self, tasks: list[TaskState]) -> int:
        alive = [t for t in tasks if not t.done]
        unvisited = [t for t in alive if t.rounds == 0]
        if unvisited:
            return unvisited[0].id
        return max(alive, key=lambda t: t.weighted_s or 0.0).id


def dense(batch: int, n_in: int, n_out: int) -> Computation:
    """relu(X @ W + b)."""
    X = placeholder((batch, n_in), "X")
    W = placeholder((n_in, n_out), "W")
    b = placeholder((n_out,), "b")
    k = reduce_axis(n_in, "k")
    Y = compute((batch, n_out), lambda i, j: sum_(X[i, k] * W[k, j], axis=k), "Y")
    Z = compute((batch, n_out), lambda i, j: relu(Y[i, j] + b[j]), "Z")
    return Computation(f"dense_{n_in}x{n_out}", [Z])


def softmax(rows: int, cols: int) -> Computation:
    X = placeholder((rows, cols), "X")
    c = reduce_axis(cols, "c")
    S = compute((rows,), lambda i: sum_(X[i, c], axis=c), "S")
    Y = compute((rows, cols), lambda i, j: X[i, j] / S[i], "Y")
    return Computation("normalize", [Y])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny sizes and budget")
    parser.add_argument("--out", help="directory for the results databases (default: temp)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="eqsched-tasks-"))
    out.mkdir(parents=True, exist_ok=True)
    batch, width = (4, 32) if args.small else (32, 256)
    tasks = [Task("dense1", dense(batch, width, width), weight=4),
             Task("dense2", dense(batch, width, width // 2)),
             Task("normalize", softmax(batch, width))]
    if args.small:
        tasks = [tasks[0], tasks[2]]
    settings = Settings(repeats=3, threads=1, finalists=0 if args.small else 4)
    trials, slice_trials = (8, 2) if args.small else (96, 8)
    rules = ["tile", "vectorize", "parallel"] if args.small else None
    search = {"population": 16} if args.small else {}  # a small run's small search

    for scheduler in ("heaviest-first", "gradient"):  # or HeaviestFirst(), or "round-robin"
        # A database per scheduler, so that none reuses another's measurements.
        result = tune_tasks(tasks, trials, scheduler=scheduler, slice_trials=slice_trials,
                            db=out / f"{scheduler}.db", cost_model="analytic", rules=rules,
                            **search, settings=settings)
        print(f"{scheduler}: tasks in order {result.order}")
        print(format_table(result.tasks))
        print(f"objective: {result.objective_s * 1e6:.2f} us\n")


if __name__ == "__main__":
    main()
