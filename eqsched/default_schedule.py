"""The schedule a computation runs when nobody tuned it: its naive program with each nest's
innermost stored axis moved innermost and vectorized, each step kept only when legal.

    sch = default_schedule(comp, lanes=16)
    sch.program, sch.trace          # the program, and the steps that build it from the naive one

A compiled model runs it for a task with nothing in the database, and task tuning measures it as
a task's first trial, so a task's best stored program is never slower than it.

See docs/ARCHITECTURE.md §19 Tasks and compiled models.
"""

from __future__ import annotations

from .ir import Block, Loop, naive_program
from .schedule import Schedule, ScheduleError
from .te import Computation


def default_schedule(comp: Computation, lanes: int) -> Schedule:
    """The naive program with, in each nest, the loop of the innermost stored axis moved
    innermost (past a reduction's axes) and vectorized `lanes` wide (split when longer), kept
    only when legal."""
    sch = Schedule(naive_program(comp))
    for root in sch.program.body:
        chain, node = [], root
        while isinstance(node, Loop) and len(node.body) == 1:
            chain.append(node)
            node = node.body[0]
        if not isinstance(node, Block) or not chain:
            continue
        spatial = [a.name for a in node.axes if a.kind == "spatial"]
        loop = next((lp for lp in chain if spatial and lp.name.endswith(f".{spatial[-1]}")), None)
        if loop is None:
            continue
        trial = sch.fork()
        try:
            if chain[-1].name != loop.name:
                trial.reorder(chain[-1].name, loop.name)
            if loop.extent > lanes:
                trial.split(loop.name, [-1, lanes])
                trial.vectorize(f"{loop.name}.1")
            else:
                trial.vectorize(loop.name)
        except ScheduleError:
            continue  # e.g. a gathered store: this nest stays as it is
        sch = trial
    return sch


__all__ = ["default_schedule"]
