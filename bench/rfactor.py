"""rfactor on two threads: the best program explore finds with the rule and without it, and the
hand schedules of examples/rfactor_softmax.py, timed side by side with numpy in one run.

    python bench/rfactor.py                       # softmax of one 65,536-long row, 64 trials
    python bench/rfactor.py --case gemv --trials 32

A batch-1 softmax's row max and row sum accumulate into one element each: without rfactor their
loops are scalar chains a second thread cannot share. The rule factors the inner piece of each
reduction into vector lanes of partial results (a vector reduction), or the outer piece into a
parallel loop over partials. Each exploration gets a fresh database and the same seed; the winners
(re-measured finalists) and numpy are then timed alternately (medians), two threads each.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

CASES = {"softmax": ("softmax", (1, 65536)), "gemv": ("gemv", (4096, 4096))}
SCHEDULES = Path(__file__).resolve().parents[1] / "examples" / "schedules"
HAND = {"softmax": {"hand (lanes)": SCHEDULES / "softmax-1x65536-rfactor-lanes.json",
                    "hand (threads)": SCHEDULES / "softmax-1x65536-rfactor.json"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=sorted(CASES), default="softmax")
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    from portability import aligned_inputs, check, kernel_run, threads_for_libraries, timed

    threads_for_libraries(args.threads)  # before numpy is imported

    from eqsched.explore import explore
    from eqsched.ir import naive_program
    from eqsched.schedule import Schedule, load_trace
    from eqsched.trials import Settings
    from eqsched.workloads import get_workload

    workload, size = CASES[args.case]
    wl = get_workload(workload)
    comp = wl.build(*size)
    programs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, rules in (("with rfactor", None), ("without", "-rfactor")):
            result = explore(workload, size, trials=args.trials, db=Path(tmp) / f"{label}.db",
                             seed=args.seed, rules=rules,
                             settings=Settings(threads=args.threads))
            if result.best_program is None:
                raise SystemExit(f"{label}: no correct program")
            programs[label] = result.best_program
            uses = any(step["op"] == "rfactor" for step in result.best_trace)
            print(f"{label}: explored {len(result.trials)} trials, best {result.best.gflops:.2f} "
                  f"GFLOPS in the run{' (uses rfactor)' if uses else ''}", file=sys.stderr)
    for label, path in HAND.get(args.case, {}).items():
        steps, _ = load_trace(path)
        programs[label] = Schedule.replay(naive_program(comp), steps).program
    inputs = aligned_inputs(comp)
    want = wl.numpy_baseline(inputs, *size)()
    runs = []
    for label, program in programs.items():
        run = kernel_run(program, inputs, args.threads, "host")
        run()
        check(label, comp, run.outputs, want)
        runs.append(run)
    runs.append(wl.numpy_baseline(inputs, *size))
    figures = timed(runs, args.repeats)
    print(f"{workload} {','.join(map(str, size))}, {args.threads} threads, medians of "
          f"{args.repeats} alternating runs")
    for label, (seconds, spread) in zip([*programs, "numpy"], figures):
        print(f"  {label:<16} {comp.flops / seconds / 1e9:8.2f} GFLOPS  {seconds * 1e6:9.1f} us"
              f"  spread {spread:5.1%}")


if __name__ == "__main__":
    main()
