"""Soundness by execution: programs drawn uniformly from each built-in workload's default space
(small size, and prime sizes where every split leaves a remainder) are derived into manual
traces, compiled, and must match the numpy reference (eqsched.tools.rulekit.check_space).

A failure is a rule bug (an illegal program in the space) or a derivation gap: the report names
the term and its sizes. The full check, 200 programs of each workload, is
bench/space_soundness.py.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest

import eqsched.egraph.space as space_module
from eqsched.backend import Target
from eqsched.egraph.term import RfactorLoop, Sizes, Term, pack_symbol, walk
from eqsched.ir import Program
from eqsched.tools.rulekit import check_space
from eqsched.workloads import list_workloads

SUITE_SAMPLES = 20


@pytest.fixture(scope="module", autouse=True)
def each_space_saturated_once():
    """Several tests check one workload at one size (a prime size's padded packs, a row's
    thread and lane partials): its space is saturated once for the file, not once per test.
    Each test still draws its own programs from it, with its own seed and filter, and derives,
    compiles and runs every one. The last 8 spaces are kept, which covers every reuse here."""
    build_space, built = space_module.build_space, OrderedDict()

    def build_once(naive, rules, limits=None, vector_lanes=space_module.VECTOR_LANES):
        key = (naive, tuple(r.name for r in rules), limits, tuple(vector_lanes))
        if key not in built:
            built[key] = build_space(naive, rules, limits, vector_lanes)
            while len(built) > 8:
                built.popitem(last=False)
        built.move_to_end(key)
        return built[key]

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(space_module, "build_space", build_once)
        yield


def assert_sound(workload: str, size: tuple[int, ...] | None, samples: int,
                 target: Target | None = None) -> None:
    failures = check_space(workload, size, samples, target=target).failures
    assert not failures, f"{len(failures)} of {samples} failed, e.g.\n" + "\n".join(
        failures[:3])


@pytest.mark.parametrize("workload", list_workloads(), ids=lambda w: w.name)
def test_sampled_programs_match_the_reference(workload):
    assert_sound(workload.name, None, SUITE_SAMPLES)


# Sizes whose output's innermost axis cannot hold a vector while another stored axis can: the
# space vectorizes across it (a blocked layout, rules.analysis.blocked_groups).
BLOCKED = [("conv2d_nchw", (1, 2, 3, 3, 8, 3, 3, 1, 1)), ("matmul", (16, 5, 7))]


@pytest.mark.parametrize("name, size", BLOCKED, ids=[name for name, _ in BLOCKED])
def test_programs_vectorized_across_the_output_match_the_reference(name, size):
    assert_sound(name, size, SUITE_SAMPLES)


# Every extent prime (or 1, or a kernel of 3): every split leaves a remainder. The full check at
# larger primes, 200 programs each, is bench/space_soundness.py.
PRIME_SIZES = {
    "batch_matmul": (2, 5, 7, 3),
    "conv2d_nchw": (1, 3, 5, 7, 5, 3, 3, 1, 1),
    "elementwise_chain": (31,),
    "gemv": (13, 47),
    "matmul": (11, 13, 7),
    "mlp": (3, 11, 7, 5),
    "mm_exp_mm": (5, 7, 3, 11),
    "softmax": (5, 23),
}
PRIME_SAMPLES = 5


@pytest.mark.parametrize("workload", list_workloads(), ids=lambda w: w.name)
def test_sampled_programs_at_prime_sizes_match_the_reference(workload):
    assert_sound(workload.name, PRIME_SIZES[workload.name], PRIME_SAMPLES)


# On an AVX2 target (16 ymm registers, vector pieces of 4-32 lanes, masks in ymm registers),
# the workloads whose spaces pad, block and mask the most: LLVM lowered a masked load wider than
# a ymm wrongly there and nowhere on the host (tests/test_backend.py).
AVX2_WORKLOADS = ("conv2d_nchw", "matmul", "mm_exp_mm")


@pytest.mark.parametrize("name", AVX2_WORKLOADS)
def test_sampled_programs_at_prime_sizes_match_the_reference_on_an_avx2_target(name):
    assert_sound(name, PRIME_SIZES[name], PRIME_SAMPLES, Target.parse("host,-avx512f"))


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
    check = check_space(name, size, PADDED_SAMPLES, where=padded, draws=400)
    assert check.sampled == PADDED_SAMPLES
    assert not check.failures, "\n".join(check.failures[:3])


def shared_partials(term: Term, sizes: Sizes, base: Program) -> bool:
    """Does the program factor a reduction over partials that threads share?"""
    return any(isinstance(s, RfactorLoop) and s.kind == "parallel" for s in term.body)


# A row statistic and a matrix-vector product, at prime sizes too (the last partial short):
# each thread accumulates its own partials, which a nest after the loop sums.
RFACTOR_SIZES = [("softmax", (1, 256)), ("softmax", (3, 61)), ("gemv", (13, 47))]


@pytest.mark.parametrize("name, size", RFACTOR_SIZES, ids=[f"{n}-{s}" for n, s in RFACTOR_SIZES])
def test_programs_whose_threads_share_a_reduction_match_the_reference(name, size):
    check = check_space(name, size, PADDED_SAMPLES, where=shared_partials, draws=400)
    assert check.sampled == PADDED_SAMPLES
    assert not check.failures, "\n".join(check.failures[:3])


def lane_partials(term: Term, sizes: Sizes, base: Program) -> bool:
    """Does the program factor a reduction along vector lanes of partials?"""
    return any(isinstance(s, RfactorLoop) and outer for s, outer in walk(term.body))


# A lane piece that divides the row, one past a remainder (61 = 3 x 16 + 13), and one wider
# than the whole axis (a padded vector over 47 points): a partial per lane, reduced after.
LANE_SIZES = [("softmax", (1, 256)), ("softmax", (3, 61)), ("gemv", (13, 47))]


@pytest.mark.parametrize("name, size", LANE_SIZES, ids=[f"{n}-{s}" for n, s in LANE_SIZES])
def test_programs_whose_lanes_are_partials_of_a_reduction_match_the_reference(name, size):
    check = check_space(name, size, PADDED_SAMPLES, where=lane_partials, draws=1000)
    assert check.sampled == PADDED_SAMPLES
    assert not check.failures, "\n".join(check.failures[:3])
