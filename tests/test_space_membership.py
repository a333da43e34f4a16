"""The default matmul space holds TVM's classic CPU matmul optimizations.

Each test writes one step of TVM's "How to optimize GEMM on CPU" recipe with the manual schedule
API (blocking 32x32 with k split by 4, vectorization, loop permutation, array packing, write cache,
parallel) and asks the saturated space whether the resulting program is a member. The space tiles
spatial axes in four levels and reduce axes in two (Ansor's SSRSRS), so a two-level TVM tile is
the same loop nest with extent-1 middle pieces.
"""

import pytest

from eqsched.backend import compile_program
from eqsched.egraph.space import build_space
from eqsched.ir import LoopKind, naive_program
from eqsched.reference import compare, random_inputs, reference, tolerance
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


def test_a_late_conv2d_stage_vectorized_over_its_output_channels():
    """conv2d with 7x7 outputs (no vector fits a row): the NCHW[x]c schedule, k in vectors of
    16 held in a local tile of 2 vectors x 7 columns, the weight packed so that k is contiguous,
    the tile written back to Y[n, k, p, q] with a scatter."""
    naive = naive_program(get_workload("conv2d_nchw").build(1, 16, 7, 7, 64, 3, 3, 1, 1))
    sch = Schedule(naive)
    sch.split("Y.k", [2, 1, 2, 16])
    sch.split("Y.rc", [16, 1])
    sch.reorder("Y.n", "Y.k.0", "Y.p", "Y.k.1", "Y.rc.0", "Y.ry", "Y.rx", "Y.rc.1", "Y.q", "Y.k.2",
                "Y.k.3")
    sch.fuse("Y.init", at="Y.k.1")
    sch.reorder("Y.init.q", "Y.init.k.2", "Y.init.k.3")
    for loop in ("Y.q", "Y.k.2", "Y.init.q", "Y.init.k.2"):
        sch.unroll(loop)
    for loop in ("Y.k.3", "Y.init.k.3"):
        sch.vectorize(loop)
    sch.cache_write("Y.update", at="Y.k.1")
    sch.pack("Y.update", "W", dim=0, factor=16)
    assert sch.program.loop("Y.write.k.3").kind == LoopKind.VECTOR  # the scattered write-back
    assert build_space(naive, default_rules()).contains_program(sch.program)
    comp = naive.computation
    inputs = random_inputs(comp, seed=1)
    ok, _, message = compare(compile_program(sch.program).run(inputs), reference(comp, inputs),
                             tolerance(comp))
    assert ok, message
