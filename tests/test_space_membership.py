"""The default matmul space holds TVM's classic CPU matmul optimizations.

Each test writes one step of TVM's "How to optimize GEMM on CPU" recipe with the manual schedule
API (blocking 32x32 with k split by 4, vectorization, loop permutation, array packing, write cache,
parallel) and asks the saturated space whether the resulting program is a member. The space tiles
spatial axes in four levels and reduce axes in two (Ansor's SSRSRS), so a two-level TVM tile is
the same loop nest with extent-1 middle pieces.
"""

import pytest

from eqsched.egraph.space import build_space
from eqsched.ir import naive_program
from eqsched.rules import default_rules
from eqsched.schedule import Schedule
from eqsched.workloads import get_workload

N, BN, KF = 64, 32, 4


@pytest.fixture(scope="module")
def space_and_naive():
    naive = naive_program(get_workload("matmul").build(N, N, N))
    return build_space(naive, default_rules()), naive


def blocked(naive, inner_order=("C.k.1", "C.i.3", "C.j.3")) -> Schedule:
    sch = Schedule(naive)
    sch.split("C.i", [N // BN, 1, 1, BN])
    sch.split("C.j", [N // BN, 1, 1, BN])
    sch.split("C.k", [N // KF, KF])
    sch.reorder("C.i.0", "C.j.0", "C.i.1", "C.j.1", "C.k.0", "C.i.2", "C.j.2", *inner_order)
    return sch


def permuted(naive) -> Schedule:
    return blocked(naive, inner_order=("C.i.3", "C.k.1", "C.j.3"))


def test_blocking(space_and_naive):
    space, naive = space_and_naive
    assert space.contains_program(blocked(naive).program)


def test_vectorization(space_and_naive):
    space, naive = space_and_naive
    sch = blocked(naive)
    sch.vectorize("C.j.3")
    assert space.contains_program(sch.program)


def test_loop_permutation(space_and_naive):
    space, naive = space_and_naive
    sch = permuted(naive)
    sch.vectorize("C.j.3")
    assert space.contains_program(sch.program)


def test_array_packing(space_and_naive):
    space, naive = space_and_naive
    sch = permuted(naive)
    sch.vectorize("C.j.3")
    sch.pack("C.update", "B", dim=1, factor=BN)
    assert space.contains_program(sch.program)


def write_cached(naive) -> Schedule:
    sch = permuted(naive)
    sch.fuse("C.init", at="C.j.1")
    sch.vectorize("C.j.3")
    sch.vectorize("C.init.j.3")
    sch.cache_write("C.update", at="C.j.1")
    sch.pack("C.update", "B", dim=1, factor=BN)
    return sch


def test_write_cache(space_and_naive):
    space, naive = space_and_naive
    assert space.contains_program(write_cached(naive).program)


def test_parallel(space_and_naive):
    space, naive = space_and_naive
    sch = write_cached(naive)
    sch.parallel("C.i.0")
    assert space.contains_program(sch.program)


def test_an_illegal_program_is_not_a_member(space_and_naive):
    space, naive = space_and_naive
    sch = blocked(naive)
    # Same loops, but the middle j pieces placed outside the outer one: pieces of one group keep
    # their order in the space, so this permutation is not in it (it is legal, merely excluded).
    sch.reorder("C.j.1", "C.i.0")
    assert not space.contains_program(sch.program)
