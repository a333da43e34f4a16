"""The backend's ceiling: hand-written matmul schedules against numpy's sgemm, one core, one run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/matmul_ceiling.py

Each size replays its schedule trace from examples/schedules/, checks the result against numpy,
then times eqsched and numpy alternately (so both see the same machine noise) and prints the
medians and their ratio against the issue's bar.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # must precede the numpy import: single-thread sgemm
os.environ["OMP_NUM_THREADS"] = "1"

import numpy as np  # noqa: E402

from eqsched.backend import CompileOptions, compile_program  # noqa: E402
from eqsched.ir import naive_program  # noqa: E402
from eqsched.schedule import Schedule, load_trace  # noqa: E402
from eqsched.workloads import get_workload  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CASES = [(512, 0.65), (1024, 0.5)]  # (size, required ratio to numpy) from issue 2


def blas_kernel() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "unknown (threadpoolctl not installed)"
    info = [f"{i['internal_api']} {i.get('architecture')} threads={i['num_threads']}"
            for i in threadpool_info()]
    return "; ".join(info) or "none"


def run_case(n: int, repeats: int) -> tuple[float, float]:
    steps, _ = load_trace(ROOT / "examples" / "schedules" / f"matmul-{n}.json")
    comp = get_workload("matmul").build(n, n, n)
    prog = Schedule.replay(naive_program(comp), steps).program
    kernel = compile_program(prog, CompileOptions(threads=1))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), np.float32)
    kernel(a, b, c)
    expect = a.astype(np.float64) @ b.astype(np.float64)
    err = float(np.max(np.abs(c - expect)) / np.max(np.abs(expect)))
    if err > 1e-4:
        sys.exit(f"matmul {n}: wrong result (max relative error {err:.2e})")
    numpy_run = get_workload("matmul").numpy_baseline({"A": a, "B": b}, n, n, n)
    ours, theirs = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        kernel(a, b, c)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        numpy_run()
        theirs.append(time.perf_counter() - t)
    flops = 2.0 * n**3
    return flops / statistics.median(ours) / 1e9, flops / statistics.median(theirs) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    print(f"numpy BLAS: {blas_kernel()}")
    print(f"{'size':>6} {'eqsched GFLOPS':>15} {'numpy GFLOPS':>13} {'ratio':>6} {'bar':>5}")
    failed = False
    for n, bar in CASES:
        ours, theirs = run_case(n, args.repeats)
        ratio = ours / theirs
        failed |= ratio < bar
        verdict = "ok" if ratio >= bar else "BELOW"
        print(f"{n:>6} {ours:>15.1f} {theirs:>13.1f} {ratio:>6.2f} {bar:>5.2f} {verdict}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
