"""Turn a long row's reductions into vector code with rfactor, by hand, and find the schedule in
the e-graph's space.

    python examples/rfactor_softmax.py                  # softmax of one 65,536-long row
    python examples/rfactor_softmax.py --out schedules/
    eqsched run softmax --size 1,65536 --schedule schedules/softmax-1x65536-rfactor-lanes.json
    python examples/rfactor_softmax.py --threads-outer  # the outer pieces shared by threads

A row max or sum accumulates into one element, so its loop cannot be vectorized: every step
waits for the one before. rfactor along the lanes splits each reduction, makes its inner piece
the first dimension of a partial-result buffer (`M_rf[c % 64, i]`, `S_rf[c % 64, i]`), so the
inner loop stores to 64 distinct partials and runs as one vector operation a step; a short
nest reduces the 64 partials after (docs/ARCHITECTURE.md §20). exp and the division run 64
lanes at a time too.

`--threads-outer` factors the outer pieces instead (`M_rf[c // 64, i]`) and runs them in
parallel: each thread accumulates its own partials, but each partial is a scalar chain.
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


def vector_reductions(sch: Schedule, lanes: int = 64) -> None:
    """Row max and row sum factored along `lanes` partials, their lane loops vectorized; exp
    and the division vectorized `lanes` wide."""
    for stage in ("M", "S"):
        _, inner = sch.split(f"{stage}.c", [-1, lanes])
        sch.rfactor(f"{stage}.update", inner)  # -> M_rf / S_rf: one partial per lane
        sch.vectorize(inner)
    for stage in ("E", "Y"):
        _, inner = sch.split(f"{stage}.j", [-1, lanes])
        sch.vectorize(inner)


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
    parser.add_argument("--threads-outer", action="store_true",
                        help="factor the outer pieces, shared by threads, instead of the lanes")
    args = parser.parse_args()
    cols = 4096 if args.small else args.cols
    comp = get_workload("softmax").build(1, cols)
    naive = naive_program(comp)
    sch = Schedule(naive)
    (two_thread_softmax if args.threads_outer else vector_reductions)(sch)
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
        kind = "rfactor" if args.threads_outer else "rfactor-lanes"
        path = args.out / f"softmax-1x{cols}-{kind}.json"
        save_trace(path, sch.trace, workload="softmax", size=[1, cols])
        print(f"saved {len(sch.trace)} steps to {path}")


if __name__ == "__main__":
    main()
