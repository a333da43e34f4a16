"""Soundness by execution: programs drawn uniformly from each built-in workload's default space
(small size, and prime sizes where every split leaves a remainder) are derived into manual
traces, compiled, and must match the numpy reference.

    python tests/test_space_soundness.py 200             # the full check: 200 programs each
    python tests/test_space_soundness.py 200 mlp matmul  # only the workloads named

A failure is a rule bug (an illegal program in the space) or a derivation gap: the report names
the term and its sizes.
"""

from __future__ import annotations

import sys
import time

import pytest

from eqsched.backend import BackendError, compile_program
from eqsched.egraph.derive import DeriveError, realize
from eqsched.egraph.encode import EncodeError
from eqsched.egraph.space import build_space
from eqsched.egraph.term import Sizes, Term, pack_symbol, show
from eqsched.ir import Program, naive_program
from eqsched.legality import ScheduleError
from eqsched.reference import compare, random_inputs, reference, tolerance
from eqsched.rules import default_rules
from eqsched.workloads import Workload, get_workload, list_workloads

SUITE_SAMPLES = 20
SEED = 0


def check_program(term: Term, sizes: Sizes, base: Program) -> str | None:
    """None if the term's program compiles and matches the reference, else what went wrong."""
    try:
        prog = realize(term, sizes, base)
        comp = prog.computation
        inputs = random_inputs(comp, seed=1)
        outputs = compile_program(prog).run(inputs)
    except (DeriveError, EncodeError, ScheduleError, BackendError) as e:
        return f"{type(e).__name__}: {e}"
    ok, _, message = compare(outputs, reference(comp, inputs), tolerance(comp))
    return None if ok else f"wrong result: {message}"


# Sizes whose output's innermost axis cannot hold a vector while another stored axis can: the
# space vectorizes across it (a blocked layout, rules.analysis.blocked_groups).
BLOCKED = [("conv2d_nchw", (1, 2, 3, 3, 8, 3, 3, 1, 1)), ("matmul", (16, 5, 7))]


def check_workload(wl: Workload, samples: int, seed: int = SEED,
                   size: tuple[int, ...] | None = None) -> tuple[int, list[str]]:
    """(programs in the space, failures as 'term | sizes | problem') for `samples` draws at
    `size` (the workload's small size by default)."""
    base = naive_program(wl.build(*(size or wl.small_size)))
    space = build_space(base, default_rules())
    failures = []
    for term, sizes in space.sample(samples, seed):
        problem = check_program(term, sizes, base)
        if problem is not None:
            failures.append(f"{show(term)} | {sorted(sizes.items())} | {problem}")
    return space.count(), failures


@pytest.mark.parametrize("workload", list_workloads(), ids=lambda w: w.name)
def test_sampled_programs_match_the_reference(workload):
    _, failures = check_workload(workload, SUITE_SAMPLES)
    assert not failures, f"{len(failures)} of {SUITE_SAMPLES} failed, e.g.\n" + "\n".join(
        failures[:3])


@pytest.mark.parametrize("name, size", BLOCKED, ids=[name for name, _ in BLOCKED])
def test_programs_vectorized_across_the_output_match_the_reference(name, size):
    _, failures = check_workload(get_workload(name), SUITE_SAMPLES, size=size)
    assert not failures, f"{len(failures)} of {SUITE_SAMPLES} failed, e.g.\n" + "\n".join(
        failures[:3])


# Every extent prime (or 1, or a kernel of 3): every split leaves a remainder. The full check at
# larger primes, 200 programs each, is bench/prime_soundness.py.
PRIME_SIZES = {
    "batch_matmul": (2, 5, 7, 3),
    "conv2d_nchw": (1, 3, 5, 7, 5, 3, 3, 1, 1),
    "elementwise_chain": (31,),
    "matmul": (11, 13, 7),
    "mlp": (3, 11, 7, 5),
    "mm_exp_mm": (5, 7, 3, 11),
    "softmax": (5, 23),
}
PRIME_SAMPLES = 5


@pytest.mark.parametrize("workload", list_workloads(), ids=lambda w: w.name)
def test_sampled_programs_at_prime_sizes_match_the_reference(workload):
    _, failures = check_workload(workload, PRIME_SAMPLES, size=PRIME_SIZES[workload.name])
    assert not failures, f"{len(failures)} of {PRIME_SAMPLES} failed, e.g.\n" + "\n".join(
        failures[:3])


PADDED_SAMPLES = 4


def padded(term: Term, sizes: Sizes, base: Program) -> bool:
    """Does the program pack an operand with a factor that does not divide its dimension?"""
    return any(base.buffer(p.buffer).shape[p.dim] % sizes[pack_symbol(p.buffer)]
               for p in term.packs)


# Prime sizes, and a convolution blocked along 24 output channels (its rows of 7 hold no
# vector): W's panels of 16 or 32 channels pad it.
PADDED_SIZES = [("matmul", PRIME_SIZES["matmul"]), ("mm_exp_mm", PRIME_SIZES["mm_exp_mm"]),
                ("conv2d_nchw", (1, 3, 5, 7, 24, 3, 3, 1, 1))]


@pytest.mark.parametrize("name, size", PADDED_SIZES, ids=[name for name, _ in PADDED_SIZES])
def test_programs_with_a_padded_pack_match_the_reference(name, size):
    base = naive_program(get_workload(name).build(*size))
    space = build_space(base, default_rules())
    drawn = [(t, s) for t, s in space.sample(400, SEED) if padded(t, s, base)][:PADDED_SAMPLES]
    assert len(drawn) == PADDED_SAMPLES
    failures = [f"{show(t)} | {sorted(s.items())} | {problem}" for t, s in drawn
                if (problem := check_program(t, s, base)) is not None]
    assert not failures, "\n".join(failures[:3])


def main(samples: int, names: list[str]) -> int:
    print(f"{'workload':<18} {'size':<24} {'programs':>14} {'sampled':>8} {'failed':>7} "
          f"{'seconds':>8}")
    failed = 0
    for wl in [get_workload(n) for n in names] if names else list_workloads():
        start = time.perf_counter()
        count, failures = check_workload(wl, samples)
        size = ",".join(map(str, wl.small_size))
        print(f"{wl.name:<18} {size:<24} {count:>14} {samples:>8} {len(failures):>7} "
              f"{time.perf_counter() - start:>8.1f}", flush=True)
        for line in failures:
            print("  FAIL", line)
        failed += len(failures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else SUITE_SAMPLES, sys.argv[2:]))
