"""Share a long row's reductions between threads with rfactor, by hand, and find the schedule in
the e-graph's space.

    python examples/rfactor_softmax.py                  # softmax of one 65,536-long row
    python examples/rfactor_softmax.py --out schedules/
    eqsched run softmax --size 1,65536 --schedule schedules/softmax-1x65536-rfactor.json

One row leaves a row max and a row sum nothing to share among threads: their only spatial loop
has one iteration. rfactor splits each reduction, makes its outer piece the first dimension of a
partial-result buffer (`M_rf[r, i]`, `S_rf[r, i]`), runs that piece in parallel (each thread
accumulates its own partials) and sums the partials after (docs/ARCHITECTURE.md §6).
exp and the division run in parallel over pieces of the row, 64 lanes at a time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eqsched.egraph.space import build_space
from eqsched.interp import run_program
from eqsched.ir import naive_program
from eqsched.reference import compare, random_inputs, reference, tolerance
from eqsched.rules import resolve
from eqsched.schedule import Schedule, save_trace
from eqsched.workloads import get_workload


def two_thread_softmax(sch: Schedule, lanes: int = 64) -> None:
    """Row max and row sum factored over `cols // lanes` partials, taken in parallel; exp and
    the division vectorized `lanes` wide, their outer pieces in parallel too."""
    for stage, axis in (("M", "c"), ("S", "c")):
        outer, _ = sch.split(f"{stage}.{axis}", [-1, lanes])
        sch.reorder(outer, f"{stage}.i")  # the row loop (one iteration) goes inside
        sch.rfactor(f"{stage}.update", outer)  # -> M_rf / S_rf: one partial per outer step
        sch.parallel(outer)
    for stage in ("E", "Y"):
        outer, inner = sch.split(f"{stage}.j", [-1, lanes])
        sch.reorder(outer, f"{stage}.i")
        sch.parallel(outer)
        sch.vectorize(inner)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cols", type=int, default=65536, help="the row's length")
    parser.add_argument("--out", type=Path, help="save the trace in this directory")
    parser.add_argument("--small", action="store_true", help="a 4,096-long row")
    args = parser.parse_args()
    cols = 4096 if args.small else args.cols
    comp = get_workload("softmax").build(1, cols)
    naive = naive_program(comp)
    sch = Schedule(naive)
    two_thread_softmax(sch)
    print(sch.program.text())

    inputs = random_inputs(comp, seed=0)
    ok, _, message = compare(run_program(sch.program, inputs), reference(comp, inputs),
                             tolerance(comp))
    print(f"interpreted against numpy: {'correct' if ok else message}")
    space = build_space(naive, resolve(None))
    found = space.contains_program(sch.program)
    print(f"in the default space of {space.count():,} programs: {found}")
    if not (ok and found):
        raise SystemExit("the hand schedule is wrong or not in the space")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"softmax-1x{cols}-rfactor.json"
        save_trace(path, sch.trace, workload="softmax", size=[1, cols])
        print(f"saved {len(sch.trace)} steps to {path}")


if __name__ == "__main__":
    main()
