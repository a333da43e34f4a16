"""Dimension groups and the other analysis facts the rules and the space are built from."""

from eqsched.egraph.facts import facts_of
from eqsched.ir import naive_program
from eqsched.te import Computation, compute, placeholder, reduce_axis, sum_
from eqsched.workloads import get_workload


def facts(name, *size):
    wl = get_workload(name)
    return facts_of(naive_program(wl.build(*(size or wl.small_size))))


def test_matmul_groups_are_its_three_axes_shared_by_init_and_update():
    f = facts("matmul", 8, 12, 6)
    assert f.groups_of("C.init") == ["C.i", "C.j"]
    assert f.groups_of("C.update") == ["C.i", "C.j", "C.k"]
    assert f.extents == {"C.i": 8, "C.j": 12, "C.k": 6}
    assert f.reduce_groups["C.update"] == {"C.k"} and f.reduce_groups["C.init"] == set()
    assert f.store_inner_group["C.update"] == "C.j"


def test_chain_joins_producer_and_consumer_axes_through_elementwise_reads():
    f = facts("mm_exp_mm", 8, 6, 12, 10)
    # D = exp(C) reads C[i, l]; F = D @ E reduces over D's second axis.
    assert f.groups_of("D") == ["C.i", "C.j"]
    assert f.groups_of("F.update") == ["C.i", "F.j", "C.j"]
    assert f.reduce_groups["F.update"] == {"C.j"}
    assert ("C.update", "D", "C.j") in f.elementwise
    assert ("D", "F.update", "C.j") in f.elementwise
    assert f.axis_of("F.update", "C.j") == "l"


def test_neighbour_and_strided_reads_do_not_join_groups():
    X = placeholder((9,), "X")
    C = compute((9,), lambda i: X[i] * 2.0, "C")
    D = compute((8,), lambda i: C[i] + C[i + 1], "D")  # reads a neighbour: not elementwise
    f = facts_of(naive_program(Computation("shift", [D])))
    assert f.group("D", "i") == "D.i" != f.group("C", "i")
    assert not f.elementwise


def test_axes_of_different_extent_stay_apart():
    X = placeholder((8,), "X")
    C = compute((8,), lambda i: X[i] + 1.0, "C")
    k = reduce_axis(4, "k")
    D = compute((4,), lambda i: sum_(C[i] + C[i + 4] * 0.0 + C[k], axis=k), "D")
    f = facts_of(naive_program(Computation("half", [D])))
    assert f.group("D.update", "i") == "D.i"
