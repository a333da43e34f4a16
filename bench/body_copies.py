"""Copies of small loop bodies (docs/ARCHITECTURE.md §7): saved programs compiled with the
backend's copies and without them (`CompileOptions(body_copies=1)`), timed side by side with
numpy in one run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/body_copies.py DIR
    OPENBLAS_CORETYPE=Haswell python bench/body_copies.py DIR --target host,-avx512f

DIR holds the traces `bench/portability.py --traces DIR` wrote; each `*-<target>.json` of the
target is replayed (or pass trace files). Per program: GFLOPS with and without copies, numpy's,
and the paired speedup the copies give (the median of the rounds' own ratios).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def traces_of(paths: list[Path], target: str) -> list[Path]:
    from portability import trace_stem

    suffix = trace_stem("", target)
    out = []
    for path in paths:
        if path.is_dir():
            out += sorted(p for p in path.glob("*.json") if p.stem.endswith(suffix))
        else:
            out.append(path)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path, help="trace files or directories of them")
    ap.add_argument("--target", default="host")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = "1"

    from portability import aligned_inputs, check, kernel_run, paired_speedup, sampled, summary

    from eqsched.ir import naive_program
    from eqsched.schedule import Schedule, load_trace
    from eqsched.workloads import get_workload

    traces = traces_of(args.paths, args.target)
    if not traces:
        raise SystemExit(f"no traces of target {args.target} in {', '.join(map(str, args.paths))}")
    print(f"{'program':40s} {'copies':>8s} {'without':>8s} {'numpy':>8s} {'speedup':>8s}")
    for path in traces:
        saved = json.loads(path.read_text())
        wl = get_workload(saved["workload"])
        comp = wl.build(*saved["size"])
        steps, _ = load_trace(str(path))
        program = Schedule.replay(naive_program(comp), steps).program
        inputs = aligned_inputs(comp)
        runs = [kernel_run(program, inputs, 1, args.target),
                kernel_run(program, inputs, 1, args.target, body_copies=1)]
        numpy_run = wl.numpy_baseline(inputs, *saved["size"])
        want = numpy_run()
        for label, run in zip(("copies", "without"), runs):
            run()
            check(f"{path.stem} ({label})", comp, run.outputs, want)
        samples = sampled([*runs, numpy_run], args.repeats)
        gflops = [comp.flops / summary(s)[0] / 1e9 for s in samples]
        print(f"{path.stem:40s} {gflops[0]:8.1f} {gflops[1]:8.1f} {gflops[2]:8.1f} "
              f"{paired_speedup(samples[0], samples[1]):8.3f}", flush=True)


if __name__ == "__main__":
    main()
