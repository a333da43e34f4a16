"""Exploration against numpy: 64 measured trials per workload on one core, then the best program
and numpy's implementation timed side by side.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/explore_vs_numpy.py
    ... --only matmul-512 --trials 64 --db /tmp/bench.db

Each case explores with a fresh database (so every trial is measured, and the wall time is that
of a cold exploration) unless --db is given; the best program is then compiled in this process
with one thread and timed alternately with the workload's numpy baseline (`numpy_baseline`: its
buffers allocated once, as the kernel's are; OpenBLAS limited to one thread), so both see the same
machine noise. Prints GFLOPS, the ratio and the bar from issue 4, and the exploration's wall time
beside the case's wall-time bar (the bars of issue 4, set from TVM MetaSchedule's tuning
times; docs/ARCHITECTURE.md §17.1).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # must precede the numpy import: single-thread BLAS
os.environ["OMP_NUM_THREADS"] = "1"

import numpy as np  # noqa: E402

from eqsched.backend import CompileOptions, compile_program  # noqa: E402
from eqsched.explore import Settings, explore  # noqa: E402
from eqsched.reference import compare, random_inputs, tolerance  # noqa: E402
from eqsched.workloads import get_workload  # noqa: E402

# name -> (workload, size, required ratio to numpy, MetaSchedule's tuning seconds)
CASES = {
    "matmul-512": ("matmul", (512, 512, 512), 0.9, 73.0),
    "matmul-1024": ("matmul", (1024, 1024, 1024), 0.75, 133.0),
    "conv2d-resnet": ("conv2d_nchw", (1, 64, 56, 56, 64, 3, 3, 1, 1), 0.9, 67.0),
    "mm_exp_mm": ("mm_exp_mm", (1024, 2048, 1024, 3072), 0.8, 551.0),
}


def side_by_side(workload: str, size: tuple[int, ...], program, repeats: int
                 ) -> tuple[float, float]:
    """(eqsched GFLOPS, numpy GFLOPS): medians of alternating runs on the same inputs."""
    wl = get_workload(workload)
    comp = wl.build(*size)
    inputs = random_inputs(comp, 0)
    kernel = compile_program(program, CompileOptions(threads=1))
    numpy_run = wl.numpy_baseline(inputs, *size)
    ours_out = kernel.run(inputs)
    theirs_out = numpy_run()
    ok, _, message = compare(ours_out, {k: v.astype(np.float64) for k, v in theirs_out.items()},
                             tolerance(comp))
    if not ok:
        sys.exit(f"{workload}: the best program disagrees with numpy: {message}")
    arrays = [inputs[b.name] for b in program.inputs]
    arrays += [np.empty(b.shape, np.float32) for b in program.outputs]
    ours, theirs = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        kernel(*arrays)
        ours.append(time.perf_counter() - start)
        start = time.perf_counter()
        numpy_run()
        theirs.append(time.perf_counter() - start)
    flops = comp.flops
    return flops / statistics.median(ours) / 1e9, flops / statistics.median(theirs) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=sorted(CASES), help="cases to run (default all)")
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, help="candidates per round (default: explore's)")
    ap.add_argument("--cost-model", default="learned")
    ap.add_argument("--db", help="database to use (default: a fresh one per case)")
    ap.add_argument("--repeats", type=int, default=20, help="side-by-side timing runs")
    args = ap.parse_args()
    rows = []
    for name in args.only or list(CASES):
        workload, size, bar, tvm_s = CASES[name]
        with tempfile.TemporaryDirectory() as tmp:
            db = args.db or str(Path(tmp) / "bench.db")
            batch = {"batch": args.batch} if args.batch else {}
            result = explore(workload, size, trials=args.trials, seed=args.seed, db=db, **batch,
                             cost_model=args.cost_model, settings=Settings(threads=1),
                             progress=lambda event, data: print(
                                 f"  {name}: {event} {data}", file=sys.stderr, flush=True))
        if result.best_program is None:
            rows.append((name, None, None, None, bar, result.wall_s, tvm_s))
            continue
        ours, theirs = side_by_side(workload, size, result.best_program, args.repeats)
        rows.append((name, ours, theirs, ours / theirs, bar, result.wall_s, tvm_s))
        print(f"{name}: best trace {result.best_trace}", file=sys.stderr)
    print(f"{'case':<14} {'eqsched':>8} {'numpy':>7} {'ratio':>6} {'bar':>5} "
          f"{'explore s':>9} {'MetaSchedule s':>14}")
    failed = False
    for name, ours, theirs, ratio, bar, wall, tvm_s in rows:
        if ours is None:
            print(f"{name:<14} no correct program found")
            failed = True
            continue
        verdict = "ok" if ratio >= bar and wall < tvm_s else "BELOW"
        failed |= verdict != "ok"
        print(f"{name:<14} {ours:>8.1f} {theirs:>7.1f} {ratio:>6.2f} {bar:>5.2f} {wall:>9.1f} "
              f"{tvm_s:>14.0f}  {verdict}")
    print("(GFLOPS, medians of alternating runs, one core; ratio = eqsched / numpy)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
