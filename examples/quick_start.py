"""Quick start: explore one workload's schedule space from Python and look at what came out.

    python examples/quick_start.py            # matmul 256^3, 32 trials on one core, ~30 s
    python examples/quick_start.py --small    # a tiny matmul, 4 trials, seconds

The command-line equivalent is `eqsched explore matmul --size 256,256,256 --trials 32`.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from eqsched.explore import Settings, explore
from eqsched.workloads import get_workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny size and budget")
    parser.add_argument("--out", help="directory for the results database (default: a temp dir)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="eqsched-quick-"))
    out.mkdir(parents=True, exist_ok=True)
    size = get_workload("matmul").small_size if args.small else (256, 256, 256)

    # Saturate the e-graph of matmul's schedules, then for `trials` candidates: let the cost
    # model pick, compile with LLVM, check against numpy, time. One thread: a one-core result.
    result = explore("matmul", size, trials=4 if args.small else 32, db=out / "eqsched.db",
                     seed=0, settings=Settings(repeats=3 if args.small else 10, threads=1),
                     **({"population": 16} if args.small else {}))  # a small run's small search

    print(result.best_program.text())  # the fastest correct program, as loops
    best = result.best
    print(f"best of {len(result.trials)} trials: {best.gflops:.2f} GFLOPS "
          f"({result.naive_median_s / best.median_s:.1f}x the naive loops)")
    print(f"space: {result.space['programs']:.3g} programs in {result.space['enodes']} e-nodes")
    for r in result.rounds:  # how well the cost model ranked each round's candidates
        rho = "n/a" if r.spearman is None else f"{r.spearman:+.2f}"
        print(f"round {r.index}: Spearman {rho}, best so far {r.best_gflops:.2f} GFLOPS")
    # The trace rebuilds the program with the manual schedule API (`eqsched run --schedule`).
    print(f"{len(result.best_trace)} schedule steps, first: {result.best_trace[:1]}")
    print(f"every measurement is in {result.db_path}; running again measures nothing new")


if __name__ == "__main__":
    main()
