"""Soundness by execution at prime sizes: every workload's space, sampled uniformly, must compute
what numpy computes when no extent has a divisor to tile by.

    PYTHONPATH=$PWD python bench/prime_soundness.py                 # 200 programs per workload
    PYTHONPATH=$PWD python bench/prime_soundness.py --samples 20 matmul softmax

Every axis of these sizes is prime (or 1, or a conv2d kernel of 3), so every tiled or vectorized
program in the sample splits with a remainder (docs/ARCHITECTURE.md §6 Programs and schedules):
each is derived into a manual trace, compiled, run on random inputs and compared with the numpy
reference. The table counts the programs that left a remainder and the failures; a failure line
names the term, its sizes and the problem.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from eqsched.backend import BackendError, compile_program
from eqsched.egraph.derive import DeriveError, realize
from eqsched.egraph.encode import EncodeError
from eqsched.egraph.space import build_space
from eqsched.egraph.term import show
from eqsched.ir import Program, naive_program
from eqsched.legality import ScheduleError
from eqsched.reference import compare, random_inputs, reference, tolerance
from eqsched.rules import default_rules
from eqsched.workloads import get_workload, list_workloads

# Prime extents, small enough that compiling and running 200 programs of each takes minutes
# (uniform samples unroll up to 16 steps per piece: a few programs emit thousands of blocks).
PRIME_SIZES = {
    "batch_matmul": (2, 7, 11, 5),
    "conv2d_nchw": (1, 3, 7, 5, 5, 3, 3, 1, 1),
    "elementwise_chain": (127,),
    "matmul": (13, 11, 7),
    "mlp": (5, 13, 11, 7),
    "mm_exp_mm": (7, 5, 11, 13),
    "softmax": (7, 31),
}


def has_remainder(prog: Program) -> bool:
    """Does some block's axis have loops that cover more than its extent?"""
    extents = {lp.name: lp.extent for lp in prog.loops()}
    return any(math.prod(extents[lp] for lp, _ in b.terms) > blk.axis(b.axis).extent
               for blk in prog.blocks() for b in blk.bindings)


def check(name: str, size: tuple[int, ...], samples: int, seed: int) -> tuple[int, int, list[str]]:
    """(programs in the space, sampled programs with a remainder, failures)."""
    base = naive_program(get_workload(name).build(*size))
    space = build_space(base, default_rules())
    inputs = random_inputs(base.computation, seed=1)
    want = reference(base.computation, inputs)
    remainders, failures = 0, []
    for term, sizes in space.sample(samples, seed):
        try:
            prog = realize(term, sizes, base)
            remainders += has_remainder(prog)
            ok, _, message = compare(compile_program(prog).run(inputs), want,
                                     tolerance(base.computation))
            problem = None if ok else f"wrong result: {message}"
        except (DeriveError, EncodeError, ScheduleError, BackendError) as e:
            problem = f"{type(e).__name__}: {e}"
        if problem is not None:
            failures.append(f"{show(term)} | {sorted(sizes.items())} | {problem}")
    return space.count(), remainders, failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workloads", nargs="*", help="workload names (default: all)")
    ap.add_argument("--samples", type=int, default=200, help="programs drawn per workload")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    names = args.workloads or [w.name for w in list_workloads()]
    missing = [n for n in names if n not in PRIME_SIZES]
    if missing:
        sys.exit(f"no prime size for workload(s) {missing}; known: {sorted(PRIME_SIZES)}")
    print(f"{'workload':<18} {'size':<22} {'programs':>10} {'sampled':>8} {'remainder':>9} "
          f"{'failed':>7} {'seconds':>8}")
    failed = 0
    for name in names:
        start = time.perf_counter()
        count, remainders, failures = check(name, PRIME_SIZES[name], args.samples, args.seed)
        size = ",".join(map(str, PRIME_SIZES[name]))
        print(f"{name:<18} {size:<22} {count:>10.3g} {args.samples:>8} {remainders:>9} "
              f"{len(failures):>7} {time.perf_counter() - start:>8.1f}", flush=True)
        for line in failures:
            print("  FAIL", line)
        failed += len(failures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
