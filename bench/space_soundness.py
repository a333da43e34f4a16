"""Soundness by execution: every workload's space, sampled uniformly, must compute what numpy
computes, at prime sizes (no extent has a divisor to tile by) or at the small sizes.

    PYTHONPATH=$PWD python bench/space_soundness.py                 # 200 programs per workload
    PYTHONPATH=$PWD python bench/space_soundness.py --samples 20 matmul softmax
    PYTHONPATH=$PWD python bench/space_soundness.py --sizes small   # the workloads' small sizes
    PYTHONPATH=$PWD python bench/space_soundness.py --target host,-avx512f   # AVX2 code

Every axis of the prime sizes is prime (or 1, or a conv2d kernel of 3), so every tiled or
vectorized program in the sample splits with a remainder (docs/ARCHITECTURE.md §6 Programs and
schedules). Each program is derived into a manual trace, compiled, run on random inputs and
compared with the numpy reference (eqsched.tools.rulekit.check_space; tests/test_space_soundness.py
runs a few of each in the suite). The table counts the programs that left a remainder and the
failures; a failure line names the term, its sizes and the problem.
"""

from __future__ import annotations

import argparse
import functools
import sys

from eqsched.args import TARGET_HELP, CliError, parse_target
from eqsched.tools.rulekit import check_spaces
from eqsched.workloads import list_workloads

# Prime extents, small enough that compiling and running 200 programs of each takes minutes
# (uniform samples unroll up to 16 steps per piece: a few programs emit thousands of blocks).
PRIME_SIZES = {
    "batch_matmul": (2, 7, 11, 5),
    "conv2d_nchw": (1, 3, 7, 5, 5, 3, 3, 1, 1),
    "elementwise_chain": (127,),
    "gemv": (13, 11),
    "matmul": (13, 11, 7),
    "mlp": (5, 13, 11, 7),
    "mm_exp_mm": (7, 5, 11, 13),
    "softmax": (7, 31),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workloads", nargs="*", help="workload names (default: all)")
    ap.add_argument("--samples", type=int, default=200, help="programs drawn per workload")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sizes", choices=("prime", "small"), default="prime")
    ap.add_argument("--target", default="host", help=TARGET_HELP)
    args = ap.parse_args()
    try:
        target = parse_target(args.target)
    except CliError as err:
        sys.exit(f"space_soundness: {err}")
    names = args.workloads or [w.name for w in list_workloads()]
    known = {w.name for w in list_workloads()} if args.sizes == "small" else set(PRIME_SIZES)
    missing = [n for n in names if n not in known]
    if missing:
        sys.exit(f"no {args.sizes} size for workload(s) {missing}; known: {sorted(known)}")
    sizes = {n: PRIME_SIZES[n] if args.sizes == "prime" else None for n in names}
    failed = check_spaces(sizes, args.samples, args.seed, functools.partial(print, flush=True),
                          target)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
